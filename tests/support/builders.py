"""Small builders for groups, so each test states only what matters to its rule."""

from __future__ import annotations

from typing import Any

from drcredit.domain.group import GroupIn


def search(*results: tuple[str, str] | tuple[str, str, str], error: str | None = None) -> dict[str, Any]:
    """A search turn; each result is (id, url) or (id, url, snippet)."""
    out = []
    for r in results:
        rid, url = r[0], r[1]
        snippet = r[2] if len(r) > 2 else f"snippet of {rid}"
        out.append({"id": rid, "url": url, "title": f"title {rid}", "snippet": snippet})
    turn: dict[str, Any] = {"type": "search", "reasoning": "look", "call": {"queries": ["q"]}, "results": out}
    if error is not None:
        turn["error"] = error
    return turn


def page(pid: str, url: str, evidence: str = "useful evidence text", error: str | None = None) -> dict[str, Any]:
    return {"id": pid, "url": url, "evidence": evidence, "summary": f"summary of {pid}", "error": error}


def visit(*pages: dict[str, Any], urls: list[str] | None = None) -> dict[str, Any]:
    called = urls if urls is not None else [p["url"] for p in pages]
    return {"type": "visit", "reasoning": "read", "call": {"urls": called, "goal": "find"}, "pages": list(pages)}


def answer(text: str = "final report") -> dict[str, Any]:
    return {"type": "answer", "reasoning": "done", "answer": text}


def tool(name: str = "calculator") -> dict[str, Any]:
    return {"type": "tool", "name": name, "arguments": {"x": 1}, "response": "2"}


def rubric(
    rid: str,
    weight: float = 1.0,
    kind: str = "factual",
    description: str | None = None,
    trusted: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "type": kind,
        "description": description or f"rubric {rid}",
        "weight": weight,
        "trusted_evidence": trusted or [],
    }


def rollout(rid: str, *turns: dict[str, Any], reward: float | None = 0.5) -> dict[str, Any]:
    out: dict[str, Any] = {"id": rid, "turns": list(turns)}
    if reward is not None:
        out["outcome_reward"] = reward
    return out


def group_doc(
    *rollouts: dict[str, Any],
    rubrics: list[dict[str, Any]] | None = None,
    params: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "question": "What happened?",
        "rubrics": rubrics or [rubric("R1")],
        "rollouts": list(rollouts),
    }
    if params is not None:
        doc["params"] = params
    doc.update(extra)
    return doc


def group(*rollouts: dict[str, Any], **kw: Any) -> GroupIn:
    return GroupIn.model_validate(group_doc(*rollouts, **kw))
