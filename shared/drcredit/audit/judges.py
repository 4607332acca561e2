"""The audit judges the operator configured: ``DRCREDIT_AUDIT_JUDGES``.

A JSON object of named judges, never taken from a request (a tenant must not make the
service call an address of its choosing). Each entry takes the main judge's settings
without their ``judge_`` prefix: ``base_url`` (one URL, a comma-separated list or a JSON
list of endpoints), ``model``, ``api_key``, and any of ``timeout_s``,
``connect_timeout_s``, ``max_tokens``, ``temperature``, ``response_format``,
``extra_body``, ``max_attempts``, ``backoff_initial_s``, ``backoff_max_s``,
``outage_deadline_s``, ``keepalive_s``, ``rpm``, ``tpm``, ``prompt_layout`` (to compare two
prompt layouts on one judge: docs/judges.md); ``"judge": "offline"`` names
the offline judge. What an entry leaves out is the main judge's setting, so the fleet
settings apply to each.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import ValidationError

from drcredit.judges import build_judge
from drcredit.judges.base import Judge
from drcredit.settings import Settings

SETTING = "DRCREDIT_AUDIT_JUDGES"

#: Entry fields and the setting each stands for.
FIELDS = {
    "judge": "judge",
    "base_url": "judge_base_url",
    "model": "judge_model",
    "api_key": "judge_api_key",
    "timeout_s": "judge_timeout_s",
    "connect_timeout_s": "judge_connect_timeout_s",
    "max_tokens": "judge_max_tokens",
    "temperature": "judge_temperature",
    "response_format": "judge_response_format",
    "extra_body": "judge_extra_body",
    "max_attempts": "judge_max_attempts",
    "backoff_initial_s": "judge_backoff_initial_s",
    "backoff_max_s": "judge_backoff_max_s",
    "outage_deadline_s": "judge_outage_deadline_s",
    "keepalive_s": "judge_keepalive_s",
    "rpm": "judge_rpm",
    "tpm": "judge_tpm",
    "prompt_layout": "judge_prompt_layout",
}


def audit_settings(settings: Settings, name: str) -> Settings:
    """The settings of the audit judge ``name``: the main ones with its entry on top."""
    entries = settings.audit_judges
    if name not in entries:
        known = ", ".join(sorted(entries)) or "none is configured"
        raise KeyError(f"no audit judge named {name!r} in {SETTING} ({known})")
    entry = entries[name]
    where = f"{SETTING}.{name}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object of judge settings, got {entry!r}")
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(FIELDS))})")
    values = settings.model_dump()
    values.update({FIELDS[k]: v for k, v in entry.items()})
    values.setdefault("judge", "openai")
    if "judge" not in entry and ("base_url" in entry or "model" in entry):
        values["judge"] = "openai"
    if isinstance(values.get("judge_base_url"), list):
        import orjson

        values["judge_base_url"] = orjson.dumps(values["judge_base_url"]).decode()
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = next((k for k, v in FIELDS.items() if v == str(error["loc"][0])), str(error["loc"][0]))
        raise ValueError(f"{where}.{field}: {error['msg']}") from None


def check_audit_judges(settings: Settings) -> None:
    """Every configured audit judge's settings hold (start-up check; ValueError names the first that does not)."""
    for name in settings.audit_judges:
        if not name or len(name) > 128:
            raise ValueError(f"{SETTING}: a judge name must have 1-128 characters, got {name!r}")
        if name == "human":
            raise ValueError(f"{SETTING}: the judge name 'human' is kept for audits against people's labels")
        build_judge(audit_settings(settings, name)).close()


class AuditJudges:
    """The audit judges of one process, built on first use and kept."""

    def __init__(self, settings: Settings, main: Judge):
        """Checks every entry at once (ValueError naming the first mistake)."""
        self.settings = settings
        self.main = main
        for name in settings.audit_judges:
            audit_settings(settings, name)
        self._built: dict[str, Judge] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return sorted(self.settings.audit_judges)

    def model_of(self, name: str) -> str | None:
        """The model the audit judge ``name`` is configured with (its settings alone)."""
        return audit_settings(self.settings, name).judge_model or (
            "offline-lexical-v1" if self.settings.audit_judges[name].get("judge") == "offline" else None
        )

    def get(self, name: str) -> Judge:
        """The judge ``name`` (KeyError naming the configured ones when there is none).

        An audit judge on the same endpoints as the main judge shares its fleet: its
        calls wait in the same queue, behind every training call.
        """
        with self._lock:
            judge = self._built.get(name)
            if judge is None:
                judge = build_judge(audit_settings(self.settings, name), fleet=self._shared_fleet(name))
                self._built[name] = judge
            return judge

    def _shared_fleet(self, name: str) -> Any:
        fleet = self.main.fleet
        entry = self.settings.audit_judges[name]
        if fleet is None or entry.get("judge") == "offline":
            return None
        from drcredit.judges.fleet.endpoints import parse_endpoints

        base = entry.get("base_url", self.settings.judge_base_url)
        if isinstance(base, list):
            import orjson

            base = orjson.dumps(base).decode()
        urls = [e.url for e in parse_endpoints(base)]
        return fleet if urls == fleet.urls else None

    async def aclose(self) -> None:
        for judge in list(self._built.values()):
            await judge.aclose()  # a fleet shared with the main judge stays open

    def close(self) -> None:
        for judge in self._built.values():
            judge.close()
