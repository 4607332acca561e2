"""Which endpoints serve the judge: ``DRCREDIT_JUDGE_BASE_URL`` read as a fleet.

Two forms. A comma-separated list of base URLs serving the same model
(``http://judge-0:8000/v1,http://judge-1:8000/v1``), each taking the judge's key. Or a
JSON list of objects, one per endpoint, for what differs between them::

    [{"url": "http://judge-0:8000/v1", "weight": 2},
     {"url": "https://api.example.com/v1", "api_key": "sk-...", "max_concurrency": 64}]

``weight`` scales an endpoint's share when several have room (a replica on twice the
hardware); ``max_concurrency`` caps what the platform learns for it (a server with a
known slot count); ``context_tokens`` fixes its context window when the server does not
report one. Every mistake is a :class:`ValueError` naming the entry and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_FIELDS = {"url", "api_key", "weight", "max_concurrency", "context_tokens", "stream"}


@dataclass(frozen=True)
class EndpointConfig:
    """One OpenAI-compatible server of the fleet, as the operator configured it."""

    url: str
    api_key: str | None = None
    weight: float = 1.0
    #: An upper bound for the learned concurrency (None: only the process ceiling).
    max_concurrency: int | None = None
    #: The context window, when the server does not report it (None: ask the server).
    context_tokens: int | None = None
    #: Ask for streamed answers: their first event says the prompt is prefilled
    #: (:mod:`~drcredit.judges.fleet.prefill`). False for a server that streams badly.
    stream: bool = True

    @property
    def chat_url(self) -> str:
        return self.url + "/chat/completions"


def parse_endpoints(value: str | None, setting: str = "DRCREDIT_JUDGE_BASE_URL") -> tuple[EndpointConfig, ...]:
    """The endpoints a setting names; the OpenAI API when it names none."""
    text = (value or "").strip()
    if not text:
        return (EndpointConfig(DEFAULT_BASE_URL),)
    if text.startswith("["):
        return _from_json(text, setting)
    urls = [part.strip() for part in text.split(",")]
    if any(not u for u in urls):
        raise ValueError(f"{setting}: an empty entry in the comma-separated list {text!r}")
    return _distinct(tuple(EndpointConfig(_checked_url(u, f"{setting}[{i}]")) for i, u in enumerate(urls)), setting)


def _from_json(text: str, setting: str) -> tuple[EndpointConfig, ...]:
    try:
        entries = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{setting}: not valid JSON ({exc})") from exc
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{setting}: expected a non-empty JSON list of endpoint objects")
    out = []
    for i, entry in enumerate(entries):
        where = f"{setting}[{i}]"
        if isinstance(entry, str):
            entry = {"url": entry}
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object with a url, got {entry!r}")
        unknown = sorted(set(entry) - _FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
        if "url" not in entry:
            raise ValueError(f"{where}.url: missing")
        out.append(
            EndpointConfig(
                url=_checked_url(entry["url"], f"{where}.url"),
                api_key=_optional_str(entry.get("api_key"), f"{where}.api_key"),
                weight=_positive(entry.get("weight", 1.0), f"{where}.weight", float),
                max_concurrency=_optional_positive_int(entry.get("max_concurrency"), f"{where}.max_concurrency"),
                context_tokens=_optional_positive_int(entry.get("context_tokens"), f"{where}.context_tokens"),
                stream=_bool(entry.get("stream", True), f"{where}.stream"),
            )
        )
    return _distinct(tuple(out), setting)


def _checked_url(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: expected a URL, got {value!r}")
    url = value.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: {value!r} is not an http(s) URL with a host")
    return url


def _distinct(endpoints: tuple[EndpointConfig, ...], setting: str) -> tuple[EndpointConfig, ...]:
    seen: set[str] = set()
    for e in endpoints:
        if e.url in seen:
            raise ValueError(f"{setting}: the endpoint {e.url} is listed twice")
        seen.add(e.url)
    return endpoints


def _optional_str(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: expected a non-empty string")
    return value


def _positive(value: Any, where: str, kind: type[float]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where}: expected a number above 0, got {value!r}")
    return kind(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    return value


def _optional_positive_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: expected an integer of at least 1, got {value!r}")
    return value
