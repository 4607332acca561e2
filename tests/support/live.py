"""Run an ASGI app for real: uvicorn on a free loopback port, in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """An ASGI app served by uvicorn in a thread, which can be stopped and started again
    on the same port (a judge or an API that goes away and comes back)."""

    def __init__(
        self, app: Any, *, lifespan: Literal["on", "off"] = "on", port: int | None = None, backlog: int = 2048
    ):
        self.app, self.lifespan, self.port, self.backlog = app, lifespan, port or free_port(), backlog
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan=self.lifespan,
            backlog=self.backlog,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        self._server, self._thread = server, thread

    def stop(self) -> None:
        """Stop serving and wait for the app's shutdown. One still running after 30 s is an
        error here, not a thread left to log after the test run has closed its streams."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(timeout=30)
            if thread.is_alive():
                raise RuntimeError(f"the app served on port {self.port} did not shut down within 30 s")


@contextmanager
def serving(app: Any, *, lifespan: Literal["on", "off"] = "on", port: int | None = None) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (http://127.0.0.1:PORT)."""
    server = LiveServer(app, lifespan=lifespan, port=port)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
