"""Running a coroutine to completion from a synchronous test."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a thread of its own: the browser tests' synchronous Playwright
    keeps an event loop running on the main thread for the rest of the session, and
    ``asyncio.run`` refuses to start under it."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main).result()
