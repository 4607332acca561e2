"""Running a coroutine to completion from a synchronous test."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a thread of its own, whatever loop the calling thread has
    running (Playwright's sync API runs one on the main thread while a browser is open,
    and ``asyncio.run`` refuses to start under it)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main).result()
