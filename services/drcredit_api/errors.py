"""Error answers: 422 naming fields, 404/409 from the pipeline, 413 for large bodies."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from drcredit.domain.errors import FieldError, InvalidInput, errors_from_pydantic
from drcredit.scoring.errors import Conflict, NotFound, NotReady


def validation_response(errors: list[FieldError]) -> JSONResponse:
    return JSONResponse(
        status_code=422,
        content={
            "message": "; ".join(str(e) for e in errors),
            "detail": [{"field": e.field, "message": e.message} for e in errors],
        },
    )


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors: list[FieldError] = []
        for err in exc.errors():
            loc = tuple(err.get("loc", ()))
            if err.get("type") == "json_invalid":
                errors.append(FieldError("body", f"invalid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}"))
                continue
            strip = 1 if loc and loc[0] in ("body", "query", "path") else 0
            converted = errors_from_pydantic([err], strip=strip)
            if loc and loc[0] == "query":
                converted = [FieldError(f"query.{e.field}", e.message) for e in converted]
            errors.extend(converted)
        return validation_response(errors)

    @app.exception_handler(InvalidInput)
    async def _invalid(_: Request, exc: InvalidInput) -> JSONResponse:
        return validation_response(exc.errors)

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
        return validation_response(errors_from_pydantic(exc.errors()))

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(NotReady)
    async def _not_ready(_: Request, exc: NotReady) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc), "status": exc.status})


class BodyLimit:
    """Answer 413 when a request body exceeds ``limit`` bytes, before it is parsed."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._reject(send)
                return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = (
            f'{{"detail": "request body exceeds the limit of {self.limit} bytes (DRCREDIT_MAX_BODY_BYTES)"}}'.encode()
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
