"""ASGI middleware run before any body is parsed: access log, authentication, body limit.

Authentication comes before the body is read, so an unauthenticated client cannot make
the service parse 60 MB; the limit is enforced on declared and chunked bodies alike.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("drcredit.access")

#: Paths that need a tenant. Every other path is operations (health, metrics, docs) or
#: the viewer's page shells under /ui, which carry no data: their script reads /v1 with
#: the reader's key.
_TENANT_PATHS = ("/v1/",)
_GROUP_IN_PATH = re.compile(r"^/v1/(groups|batches)/([^/]+)")


async def _send_error(send: Send, status: int, message: str, field: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = orjson.dumps({"message": message, "detail": [{"field": field, "message": message}]})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class AccessLog:
    """One structured line per request: method, path, status, latency, tenant, group or batch id."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = scope.get("path", "")
            found = _GROUP_IN_PATH.match(path)
            extra: dict[str, Any] = {
                "method": scope.get("method"),
                "path": path,
                "status": status,
                "latency_ms": round((time.perf_counter() - started) * 1000, 2),
                "tenant": scope.get("state", {}).get("tenant"),
            }
            if found:
                extra["batch_id" if found[1] == "batches" else "group_id"] = found[2]
            log.info("request", extra=extra)


class Authenticate:
    """Resolve the bearer key to a tenant (``scope["state"]["tenant"]``) or answer 401."""

    def __init__(self, app: ASGIApp, keys: dict[str, str], open_tenant: str):
        self.app = app
        self.keys = [(key.encode(), tenant) for key, tenant in keys.items()]
        self.open_tenant = open_tenant

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(_TENANT_PATHS):
            await self.app(scope, receive, send)
            return
        tenant = self.open_tenant if not self.keys else self._tenant(scope)
        if tenant is None:
            await _send_error(
                send,
                401,
                "missing or invalid API key: send Authorization: Bearer <key>",
                "authorization",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)

    def _tenant(self, scope: Scope) -> str | None:
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        scheme, _, token = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        given = token.strip().encode()
        found = None
        for key, tenant in self.keys:  # every key compared: no early exit to time
            if hmac.compare_digest(key, given):
                found = tenant
        return found


class BodyLimit:
    """Answer 413 when a request body exceeds ``limit`` bytes, before it is parsed.

    A declared ``content-length`` is checked at once; a chunked body is read up to the
    limit first and handed on whole, so the 413 comes from here and never as a parse error.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.limit:
                await self._reject(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}]), send)

    async def _reject(self, send: Send) -> None:
        message = f"request body exceeds the limit of {self.limit} bytes (DRCREDIT_MAX_BODY_BYTES)"
        await _send_error(send, 413, message, "body", [])


def _replay(messages: list[Message]) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    return receive
