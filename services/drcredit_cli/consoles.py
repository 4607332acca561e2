"""The CLI's two consoles and its way to fail: one home, so every command prints the same way."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

#: Tables and results.
out = Console()
#: Errors and progress; an error is one line, whatever the terminal's width.
err = Console(stderr=True, soft_wrap=True)

#: Bad input or configuration: one line says what to fix (every command's start-up checks).
EXIT_INPUT = 2


def fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
    """Say what is wrong in one line on stderr and exit with ``code``."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code=code)
