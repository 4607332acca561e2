"""Bearer API keys, each belonging to a tenant; without keys the API runs open.

The key is checked by :class:`drcredit_api.middleware.Authenticate` before any body is
read; the dependency here hands its tenant to the handlers and declares the bearer
scheme in the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

OPEN_TENANT = "public"

bearer = HTTPBearer(auto_error=False, description="An API key from DRCREDIT_API_KEYS (tenant:key pairs)")


def tenant_of(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """The caller's tenant; every group and batch query is scoped to it."""
    tenant = getattr(request.state, "tenant", None)
    if tenant is None:  # only when the middleware did not run (an app without it)
        raise HTTPException(
            status_code=401, detail="missing or invalid API key", headers={"WWW-Authenticate": "Bearer"}
        )
    return str(tenant)
