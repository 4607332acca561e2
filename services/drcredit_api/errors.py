"""Error answers, all of one shape: ``{"message": ..., "detail": [{"field", "message"}, ...]}``.

422 names each offending field; 404 names the id; 409 says what differs or the group's
status; 413 and 415 say what the body must be; 503 (with ``Retry-After``) says what is
away. Nothing the platform receives should answer a bare 500: an unexpected error still
answers in this shape, and is logged with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from drcredit.domain.errors import FieldError, InvalidInput, errors_from_pydantic
from drcredit.scoring.errors import Conflict, NotFound, NotReady, Unavailable
from drcredit.tenancy.budgets import BudgetExhausted

log = logging.getLogger("drcredit.api")


class Forbidden(StarletteHTTPException):
    """A 403 whose ``detail`` names what was refused (a parameter such as ``tenant``, or
    ``authorization`` when the key itself may not ask)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(403, message)
        self.field = field


def error_response(
    code: int,
    message: str,
    detail: list[tuple[str, str]] | list[FieldError],
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    items = [
        {"field": d.field, "message": d.message} if isinstance(d, FieldError) else {"field": d[0], "message": d[1]}
        for d in detail
    ]
    return JSONResponse({"message": message, "detail": items, **extra}, code, headers=headers)


def validation_response(errors: list[FieldError]) -> JSONResponse:
    return error_response(422, "; ".join(str(e) for e in errors), errors)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _line_and_column(document: Any, position: Any) -> str:
    if not isinstance(document, str) or not isinstance(position, int):
        return ""
    line = document.count("\n", 0, position) + 1
    column = position - (document.rfind("\n", 0, position) + 1) + 1
    return f" at line {line}, column {column}"


def unavailable_response(message: str, retry_after_s: int = 5) -> JSONResponse:
    return error_response(
        503, message, [("service", message)], headers={"Retry-After": str(retry_after_s)}, retry_after_s=retry_after_s
    )


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        content_type = request.headers.get("content-type")
        if request.method in ("POST", "PUT", "PATCH") and content_type and not _is_json(content_type):
            message = f"the body must be JSON sent with Content-Type: application/json (got {content_type})"
            return error_response(415, message, [("content-type", message)])
        errors: list[FieldError] = []
        for err in exc.errors():
            loc = tuple(err.get("loc", ()))
            if err.get("type") == "json_invalid":
                where = _line_and_column(getattr(exc, "body", None), loc[1] if len(loc) > 1 else None)
                reason = err.get("ctx", {}).get("error", err.get("msg"))
                errors.append(FieldError("body", f"invalid JSON{where}: {reason}"))
                continue
            if loc == ("body",) and err.get("type") == "missing":
                errors.append(FieldError("body", "must be a JSON object (got an empty body)"))
                continue
            strip = 1 if loc and loc[0] in ("body", "query", "path") else 0
            converted = errors_from_pydantic([err], strip=strip)
            if loc and loc[0] in ("query", "path"):
                converted = [FieldError(f"{loc[0]}.{e.field}", e.message) for e in converted]
            # A problem with the body as a whole (null, an array) is named on the body.
            errors.extend(FieldError(e.field or "body", e.message) for e in converted)
        return validation_response(errors)

    @app.exception_handler(InvalidInput)
    async def _invalid(_: Request, exc: InvalidInput) -> JSONResponse:
        return validation_response(exc.errors)

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
        return validation_response(errors_from_pydantic(exc.errors()))

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error_response(404, str(exc), [(exc.field, str(exc))])

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return error_response(409, str(exc), exc.differences or [("", str(exc))])

    @app.exception_handler(NotReady)
    async def _not_ready(_: Request, exc: NotReady) -> JSONResponse:
        return error_response(409, str(exc), [("status", exc.status)], status=exc.status)

    @app.exception_handler(BudgetExhausted)
    async def _budget(_: Request, exc: BudgetExhausted) -> JSONResponse:
        b = exc.state
        error = {
            "code": "budget_exhausted",
            "budget": b.budget,
            "limit": b.limit,
            "used": b.used,
            "resets_at": b.resets_at.isoformat(),
        }
        return JSONResponse(
            {"message": str(exc), "detail": [{"field": "budget", "message": str(exc)}], "error": error},
            429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(Unavailable)
    async def _unavailable(_: Request, exc: Unavailable) -> JSONResponse:
        return unavailable_response(str(exc), exc.retry_after_s)

    @app.exception_handler(OperationalError)
    async def _database_away(_: Request, exc: OperationalError) -> JSONResponse:
        log.warning("database unavailable: %s", exc.orig)
        return unavailable_response("the database is unavailable; try again shortly")

    @app.exception_handler(DBAPIError)
    async def _database_error(_: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:
            return unavailable_response("the database connection was lost; try again shortly")
        log.error("database error", exc_info=exc)
        return error_response(500, "internal error (logged)", [("", "internal error")])

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        allowed = (exc.headers or {}).get("Allow")
        if exc.status_code == 405 and allowed:
            message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
        field = getattr(exc, "field", None) or {401: "authorization", 404: "path", 405: "method"}.get(
            exc.status_code, ""
        )
        return error_response(exc.status_code, message, [(field, message)], headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=exc)
        return error_response(500, "internal error (logged)", [("", "internal error")])
