"""Command classes whose help pages read well: flags as flags, prose fitted to the terminal.

Typer prints each option's value type in ``--help``, flags included, so ``--json`` read
``--json <bool>`` as if it took a value. A flag takes none: these classes give each flag an
empty value name, which the help page prints as nothing. A flag's value name is shown
nowhere else (usage lines and error hints name flags by their option strings).

Typer keeps the line breaks of a docstring's later paragraphs, so on a terminal narrower
than the source lines each one wrapped again, leaving a word or two alone on a line. The
help text's paragraphs are joined into one line each here (lists and indented blocks kept
as written), and the terminal wraps them.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from typer.core import TyperCommand, TyperGroup, TyperOption


def _plain_flags(params: Sequence[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return list(params)


def reflowed(text: str | None) -> str | None:
    """``text`` with each paragraph on one line, but for lists and indented lines."""
    if not text:
        return text
    help_text, cut, rest = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for paragraph in help_text.split("\n\n"):
        lines = paragraph.split("\n")
        kept = paragraph.startswith("\b") or any(line.startswith((" ", "-", "*", "|")) for line in lines)
        paragraphs.append(paragraph if kept else " ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs) + cut + rest


class Command(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflowed(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


class Group(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflowed(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))
