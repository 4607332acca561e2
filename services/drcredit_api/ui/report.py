"""The data of one viewer page, gathered for ``drcredit report``: from a running service
(over its ``/v1`` API, with the caller's key) or from a database directly (the embedded
SQLite file, or any ``DRCREDIT_DATABASE_URL``). Either way the page is keyed by the same
API paths, so the report shows what the viewer would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

import httpx
import orjson

from drcredit.analytics.evidence import evidence_document
from drcredit.analytics.runs import list_runs, run_document
from drcredit.analytics.sensitivity import batch_sensitivity
from drcredit.audit import service as audits
from drcredit.domain.drift import DEFAULT_DRIFT_THRESHOLD
from drcredit.domain.evidence import DEFAULT_BUDGETS
from drcredit.domain.usage import JudgePrice
from drcredit.scoring.results import breakdown, documents
from drcredit.storage.database import Database
from drcredit_api.ui.pages import render

#: Batches of a run whose sensitivity table a report includes (the latest ones).
REPORT_BATCHES = 20
#: Known runs an unknown run's error names (the newest ones).
NAMED_RUNS = 20

Fetch = Callable[[str], dict[str, Any]]


def _q(value: str) -> str:
    # As the viewer's encodeURIComponent.
    return quote(value, safe="-_.!~*'()")


def page_paths(kind: str, name: str) -> list[str]:
    if kind == "group":
        base = f"/v1/groups/{_q(name)}"
        return [f"{base}/advantages", f"{base}/credits", f"{base}/evidence"]
    return [f"/v1/runs/{_q(name)}", f"{AUDITS_OF_RUN}{_q(name)}"]


#: The run page's list of audits (GET /v1/audits?run=), then each done one's document.
AUDITS_OF_RUN = "/v1/audits?run="
AUDIT = "/v1/audits/"


def collect(kind: str, name: str, fetch: Fetch) -> dict[str, Any]:
    data = {path: fetch(path) for path in page_paths(kind, name)}
    if kind == "run":
        batches = [b for step in data[f"/v1/runs/{_q(name)}"]["steps"] for b in step["batches"]]
        for batch in list(dict.fromkeys(batches))[-REPORT_BATCHES:]:
            path = f"/v1/batches/{_q(batch)}/sensitivity"
            data[path] = fetch(path)
        for audit in data[f"{AUDITS_OF_RUN}{_q(name)}"]["audits"]:
            if audit["status"] == "done":
                path = f"{AUDIT}{_q(audit['audit_id'])}"
                data[path] = fetch(path)
    return data


def remote_fetch(client: httpx.Client) -> Fetch:
    def fetch(path: str) -> dict[str, Any]:
        r = client.get(path)
        if r.status_code != 200:
            try:
                message = r.json().get("message", r.text)
            except ValueError:
                message = r.text
            raise LookupError(f"{path}: HTTP {r.status_code}: {message}")
        body: dict[str, Any] = r.json()
        return body

    return fetch


def database_fetch(
    db: Database,
    tenant: str,
    kind: str,
    name: str,
    price: JudgePrice | None = None,
    drift_threshold: float = DEFAULT_DRIFT_THRESHOLD,
) -> Fetch:
    """The documents the endpoints would answer, read from the database directly (costs
    at ``price`` and drift flagged above ``drift_threshold``, as the service's
    ``DRCREDIT_JUDGE_PRICE`` and ``DRCREDIT_DRIFT_THRESHOLD`` would give them)."""

    def fetch(path: str) -> dict[str, Any]:
        with db.session() as s:
            if path.startswith(AUDITS_OF_RUN):
                return {"audits": audits.listing(s, tenant, unquote(path[len(AUDITS_OF_RUN) :]))}
            if path.startswith(AUDIT):
                return audits.document(audits.find(s, tenant, unquote(path[len(AUDIT) :])))
            if path.endswith("/advantages"):
                # As the API serves it: the document stored when the group finished.
                documents.require_done(documents.find_group(s, tenant, name))
                stored = documents.final_advantages(s, tenant, documents.final_states(s, tenant, [name]), price)
                served: dict[str, Any] = orjson.loads(orjson.dumps(stored[0]))
                return served
            if path.endswith("/credits"):
                return breakdown.credits_document(s, documents.find_group(s, tenant, name, full=True))
            if path.endswith("/evidence"):
                return evidence_document(s, documents.find_group(s, tenant, name), DEFAULT_BUDGETS)
            if path == "/v1/runs":
                return list_runs(s, tenant)
            if path.endswith("/sensitivity"):
                batch_id = path.split("/")[3]
                return batch_sensitivity(s, documents.find_batch(s, tenant, unquote(batch_id)))
            return run_document(s, tenant, name, DEFAULT_BUDGETS, price, drift_threshold)

    return fetch


def missing_run(name: str, fetch: Fetch) -> str | None:
    """Why ``name`` is not a run the reader can see, naming the runs it can; None when it is."""
    runs = [r["run"] for r in fetch("/v1/runs")["runs"]]
    if name in runs:
        return None
    if not runs:
        return f"run {name!r} not found: no run is stored yet (a group joins a run through its metadata.run)"
    shown = ", ".join(runs[:NAMED_RUNS])
    more = f" and {len(runs) - NAMED_RUNS} more" if len(runs) > NAMED_RUNS else ""
    return f"run {name!r} not found; known runs, newest first: {shown}{more}"


def report_html(kind: str, name: str, fetch: Fetch) -> str:
    return render(kind, {kind: name}, data=collect(kind, name, fetch))
