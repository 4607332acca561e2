"""What every command that builds the platform does first: read the settings and build
the runtime, each usual mistake (a bad setting, an unreachable database) one line and
an exit code."""

from __future__ import annotations

import re
from typing import Any, NoReturn

from pydantic import ValidationError
from pydantic_settings import SettingsError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from drcredit.settings import Settings
from drcredit.wiring.runtime import Runtime
from drcredit_cli.consoles import fail


def setting_problem(error: Any) -> str:
    """One validation error as ``DRCREDIT_NAME: what is wrong``: the setting named once
    (a validator's message usually names it already), without pydantic's "Value error, "."""
    message = str(error["msg"]).removeprefix("Value error, ")
    loc = "_".join(str(p) for p in error["loc"]).upper()
    name = f"DRCREDIT_{loc}" if loc else ""
    if not name or message.startswith(name):  # a model-level check names its own setting
        return message
    return f"{name}: {message}"


def load_settings(**overrides: Any) -> Settings:
    """The environment's settings, or one line per mistake in it."""
    try:
        settings = Settings()
    except ValidationError as exc:
        fail("invalid configuration: " + "; ".join(setting_problem(e) for e in exc.errors()))
    except SettingsError as exc:  # a JSON setting (DRCREDIT_AUDIT_JUDGES, ...) that is not JSON
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"DRCREDIT_{field.group(1).upper()}" if field else "a DRCREDIT_* setting"
        fail(f"invalid configuration: {name}: not valid JSON ({exc.__cause__ or exc})")
    return settings.model_copy(update=overrides) if overrides else settings


def database_unreachable(settings: Settings, exc: OperationalError) -> NoReturn:
    url = make_url(settings.resolved_database_url).render_as_string(hide_password=True)
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    fail(f"cannot reach the database {url}: {reason} (check DRCREDIT_DATABASE_URL)")


def build_runtime(settings: Settings, *, check_only: bool = False) -> Runtime | None:
    """Build the runtime (or only check what it needs), turning the usual start-up
    mistakes into one line each."""
    try:
        if check_only:
            Runtime.check(settings)
            return None
        return Runtime.build(settings)
    except OperationalError as exc:
        database_unreachable(settings, exc)
    except ValueError as exc:  # judge settings, API keys
        fail(str(exc))
