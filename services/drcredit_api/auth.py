"""Bearer API keys, each belonging to a tenant; without keys the API runs open."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request

OPEN_TENANT = "public"


def tenant_of(request: Request) -> str:
    """The caller's tenant; every group and batch query is scoped to it."""
    keys: dict[str, str] = request.app.state.tenant_keys
    if not keys:
        return OPEN_TENANT
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        for key, tenant in keys.items():
            if hmac.compare_digest(key.encode(), token.strip().encode()):
                return tenant
    raise HTTPException(status_code=401, detail="missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
