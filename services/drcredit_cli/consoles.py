"""The CLI's two consoles: one home, so every command prints the same way."""

from __future__ import annotations

from rich.console import Console

#: Tables and results.
out = Console()
#: Errors and progress; an error is one line, whatever the terminal's width.
err = Console(stderr=True, soft_wrap=True)
