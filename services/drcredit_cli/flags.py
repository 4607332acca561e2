"""Command classes whose help pages show flags as flags.

Typer prints each option's value type in ``--help``, flags included, so ``--json`` read
``--json <bool>`` as if it took a value. A flag takes none: these classes give each flag an
empty value name, which the help page prints as nothing. A flag's value name is shown
nowhere else (usage lines and error hints name flags by their option strings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typer.core import TyperCommand, TyperGroup, TyperOption


def _plain_flags(params: Sequence[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return list(params)


class Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


class Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))
