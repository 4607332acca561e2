"""A labeler's queue: a sample of the judge's judgments, each with what the judge saw.

The candidates are the keys of the done groups in scope whose original judgment
succeeded (a failed one has no answer to check), of the asked kind, that this labeler
has not labeled; ``n`` of them are drawn uniformly without replacement with ``seed``
from the candidates in key order, so the same request draws the same items. Each item
carries what the judge was shown (the question, the rubric, the support already
credited and the pages; or the snippets; or the report; or the claim and its pages) and
never the judge's answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.audit.labels.keys import JUDGMENT_KIND, Key, item_id, originals, public_key
from drcredit.audit.labels.store import labeled_keys, positive_rubrics
from drcredit.audit.report import KINDS
from drcredit.audit.sampling import groups_in_scope
from drcredit.audit.schemas import AuditScope
from drcredit.domain.credit import eligible_results, visited_urls
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.group import Rollout, Rubric, SearchTurn, VisitTurn
from drcredit.domain.outcome import JOINT, report_of
from drcredit.scoring.errors import NotFound
from drcredit.scoring.intake.content import params_of
from drcredit.scoring.results.outcomes import citation_call, page_evidence, stored_facts
from drcredit.storage import models as m
from drcredit.storage import repository as repo
from drcredit.storage.histories import support_histories


def scoped_groups(s: Session, tenant: str, scope: AuditScope, prefix: str = "") -> list[m.Group]:
    """The done groups of the scope, by group id; errors name the fields under ``prefix``
    (the query's own parameters by default, ``scope.`` in an audit request)."""
    try:
        ids = groups_in_scope(s, tenant, scope)
    except NotFound as exc:
        raise NotFound(str(exc), prefix + exc.field.removeprefix("scope.")) from exc
    except InvalidInput as exc:
        raise InvalidInput(
            [FieldError(prefix + e.field.removeprefix("scope."), e.message) for e in exc.errors]
        ) from exc
    if not ids:
        return []
    rows = s.scalars(select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id.in_(ids)))
    return sorted(rows, key=lambda g: g.group_id)


def queue(
    s: Session, tenant: str, scope: AuditScope, kinds: Sequence[str], n: int, seed: int, labeler: str
) -> dict[str, Any]:
    """``n`` items for ``labeler`` (fewer when fewer are left), and how many were left."""
    groups = scoped_groups(s, tenant, scope)
    by_pk = {g.id: g for g in groups}
    done = labeled_keys(s, tenant, list(by_pk), labeler)
    candidates: list[tuple[m.Group, Key]] = []
    j = m.Judgment
    judgment_kinds = [JUDGMENT_KIND[k] for k in kinds]
    rows = s.execute(
        select(
            j.group_pk, j.kind, j.rollout_id, j.turn_index, j.rubric_id, j.status, j.level, j.matches, j.prior_support
        ).where(j.group_pk.in_(list(by_pk)), j.kind.in_(judgment_kinds), j.status == "ok")
    ).all()
    per_group: dict[int, list[Any]] = {}
    for row in rows:
        per_group.setdefault(row[0], []).append(row[1:])
    for group in groups:
        keys = originals(per_group.get(group.id, ()), positive_rubrics(group))
        candidates += [(group, key) for key in sorted(keys) if key[0] in kinds and (group.id, key) not in done]
    chosen = random.Random(seed).sample(candidates, min(n, len(candidates)))
    shown = _Shown(s)
    items = [
        {
            "item_id": item_id(group.group_id, key),
            "group_id": group.group_id,
            "kind": key[0],
            "key": public_key(key),
            "shown": shown.of(group, key),
        }
        for group, key in chosen
    ]
    return {"labeler": labeler, "kinds": list(kinds), "available": len(candidates), "items": items}


def parse_kinds(raw: str | None) -> list[str]:
    """``kind`` of the query: one kind, several separated by commas, or every kind."""
    if not raw:
        return list(KINDS)
    kinds = [k.strip() for k in raw.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise InvalidInput(
            [FieldError("kind", f"unknown kind {unknown[0] if unknown else raw!r} (one of {', '.join(KINDS)})")]
        )
    return list(dict.fromkeys(kinds))


class _Shown:
    """What the judge saw at a key, from the stored group (content read once per rollout)."""

    def __init__(self, s: Session):
        self.s = s
        self._rollouts: dict[tuple[int, str], Rollout] = {}
        self._histories: dict[tuple[int, str], dict[str, list[tuple[int, str]]]] = {}

    def rollout(self, group: m.Group, rollout_id: str) -> Rollout:
        if (group.id, rollout_id) not in self._rollouts:
            doc = repo.rollout_documents(self.s, group.id, [rollout_id])[rollout_id]
            self._rollouts[(group.id, rollout_id)] = Rollout.model_validate(doc["rollouts"][0])
        return self._rollouts[(group.id, rollout_id)]

    def history(self, group: m.Group, rollout_id: str, rubric_id: str, before: int) -> list[str]:
        if (group.id, rollout_id) not in self._histories:
            found = support_histories(self.s, [group.id], [rollout_id])
            self._histories[(group.id, rollout_id)] = {rid: points for (_, _, rid), points in found.items()}
        return [text for t, text in self._histories[(group.id, rollout_id)].get(rubric_id, []) if t < before]

    def of(self, group: m.Group, key: Key) -> dict[str, Any]:
        kind, rollout_id, turn, name = key
        rollout = self.rollout(group, rollout_id)
        if kind == "citation":
            row = self.s.scalar(
                select(m.Rollout.outcome_facts).where(
                    m.Rollout.group_pk == group.id, m.Rollout.rollout_id == rollout_id
                )
            )
            claim, pages = citation_call(stored_facts(row), page_evidence(rollout), f"{name}:{JOINT}")
            return {"claim": claim, "pages": [{"url": url, "evidence": evidence} for url, evidence in pages]}
        rubric = _rubric(group, name)
        base: dict[str, Any] = {"question": group.question}
        if kind == "visit":
            visit = rollout.turns[turn]
            assert isinstance(visit, VisitTurn)
            history = self.history(group, rollout_id, name, turn) if params_of(group).history else []
            return {
                **base,
                "rubric": _rubric_json(rubric, full=True),
                "support_already_credited": history,
                "visit": {
                    "reasoning": visit.reasoning,
                    "goal": visit.call.goal,
                    "urls": list(visit.call.urls),
                    "pages": [
                        {"id": p.id, "url": p.url, "evidence": p.evidence or "", "summary": p.summary or ""}
                        for p in visit.usable_pages
                    ],
                },
            }
        if kind == "snippet":
            search = rollout.turns[turn]
            assert isinstance(search, SearchTurn)
            results = eligible_results(rollout, search, visited_urls(rollout))
            return {
                **base,
                "rubric": _rubric_json(rubric, full=False),
                "snippets": [{"id": r.id, "snippet": r.snippet} for r in results],
            }
        located = report_of(rollout)
        return {**base, "rubric": _rubric_json(rubric, full=False), "report": located[1] if located else ""}


def _rubric(group: m.Group, rubric_id: str) -> Rubric:
    return Rubric.model_validate(next(r for r in group.rubrics if r["id"] == rubric_id))


def _rubric_json(rubric: Rubric, *, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"id": rubric.id, "type": rubric.type, "description": rubric.description}
    if full:
        out.update(weight=rubric.weight, reference_facts=list(rubric.trusted_evidence))
    return out
