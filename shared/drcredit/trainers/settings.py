"""Where the service is and how a trainer waits for it: one settings object for every adapter.

Each adapter reads its trainer's own config section (VeRL's ``algorithm.drcredit``, a
SkyRL or prime-rl mapping, TRL keyword arguments) with :meth:`DrCreditSettings.from_config`,
falling back to the environment, so a run is configured the same way whatever trains it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drcredit.trainers.converters import ToolNames

#: Default wait for a step's scoring, and for a service that cannot be reached.
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_UNREACHABLE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DrCreditSettings:
    """Where the service is and how scoring is done; see :meth:`from_config`."""

    base_url: str | None = None
    api_key: str | None = None
    #: The longest a training step waits for its advantages, whatever the reason.
    timeout_s: float = DEFAULT_TIMEOUT_S
    id_prefix: str = ""
    params: Mapping[str, Any] | None = None
    tool_names: ToolNames = field(default_factory=ToolNames)
    #: The training run the groups belong to (``metadata.run``, for the viewer and analytics).
    run: str | None = None
    #: How long the service may stay unreachable (refused connections, 5xx) before the step
    #: raises :class:`drcredit.trainers.service.DrCreditUnavailable`; the step waits meanwhile.
    unreachable_timeout_s: float = DEFAULT_UNREACHABLE_TIMEOUT_S
    #: Show the SDK's progress bar (judgments or groups done) on stderr while a step waits.
    progress: bool = False

    def __post_init__(self) -> None:
        for name in ("timeout_s", "unreachable_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"drcredit.{name} must be a non-negative number of seconds, got {value!r}")

    def metadata(self, step: int | None) -> dict[str, Any] | None:
        """``metadata.run`` and ``metadata.step`` of this step's groups (None without a run)."""
        if not self.run:
            return None
        return {"run": self.run} if step is None else {"run": self.run, "step": int(step)}

    @classmethod
    def from_config(cls, config: Any = None) -> DrCreditSettings:
        """Read ``config["drcredit"]`` (e.g. VeRL's ``algorithm`` section), then the environment.

        Keys: ``base_url`` (else ``$DRCREDIT_URL``, else the SDK's default), ``api_key`` (else
        ``$DRCREDIT_API_KEY``), ``timeout_s`` (else ``$DRCREDIT_WAIT_TIMEOUT_S``, else 1800: the
        longest a training step waits for its advantages), ``unreachable_timeout_s`` (else
        ``$DRCREDIT_UNREACHABLE_TIMEOUT_S``, else 300: how long the step keeps retrying a
        service it cannot reach before it raises), ``progress`` (else ``$DRCREDIT_PROGRESS``:
        a progress bar while waiting), ``id_prefix`` (else ``$DRCREDIT_ID_PREFIX``: prepended
        to group and batch ids, e.g. the run name), ``params`` (the method's parameters for
        every group, docs/parameters.md), ``search_tools`` / ``visit_tools`` (tool names),
        ``run`` (else ``$DRCREDIT_RUN``, else ``id_prefix`` without its trailing separator:
        the run the groups are filed under, with the trainer's step).
        """
        section = _section(config)
        defaults = ToolNames()
        params = section.get("params")
        prefix = str(section.get("id_prefix") or os.environ.get("DRCREDIT_ID_PREFIX") or "")
        return cls(
            base_url=_opt_str(section.get("base_url")) or os.environ.get("DRCREDIT_URL") or None,
            api_key=_opt_str(section.get("api_key")) or os.environ.get("DRCREDIT_API_KEY") or None,
            timeout_s=_seconds(section, "timeout_s", "DRCREDIT_WAIT_TIMEOUT_S", DEFAULT_TIMEOUT_S),
            unreachable_timeout_s=_seconds(
                section, "unreachable_timeout_s", "DRCREDIT_UNREACHABLE_TIMEOUT_S", DEFAULT_UNREACHABLE_TIMEOUT_S
            ),
            progress=_flag(section.get("progress", os.environ.get("DRCREDIT_PROGRESS"))),
            id_prefix=prefix,
            run=(_opt_str(section.get("run")) or os.environ.get("DRCREDIT_RUN") or prefix.rstrip("-_.:") or None),
            params=plain_value(params) if params is not None else None,
            tool_names=ToolNames(
                search=tuple(plain_value(section.get("search_tools")) or defaults.search),
                visit=tuple(plain_value(section.get("visit_tools")) or defaults.visit),
            ),
        )


def _section(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    getter = getattr(config, "get", None)
    value = getter("drcredit", None) if callable(getter) else None
    plain = plain_value(value) if value is not None else {}
    if not isinstance(plain, dict):
        raise ValueError(f"the drcredit config section must be a mapping, got {type(plain).__name__}")
    return plain


def _seconds(section: Mapping[str, Any], key: str, env: str, default: float) -> float:
    raw = section.get(key, os.environ.get(env))
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"drcredit.{key} (or ${env}) must be a number of seconds, got {raw!r}") from None


def _flag(raw: Any) -> bool:
    if isinstance(raw, str):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return bool(raw)


def plain_value(value: Any) -> Any:
    """OmegaConf containers, numpy scalars/arrays and mappings as plain Python values."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    to_container = getattr(sys.modules.get("omegaconf"), "OmegaConf", None)
    if to_container is not None and type(value).__module__.startswith("omegaconf"):
        return to_container.to_container(value, resolve=True)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def _opt_str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
