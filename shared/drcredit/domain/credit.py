"""Turn credits from stored ordinal judgments (docs/method.md: "Visit credit", "Search credit", "Turn credit").

The judge's answers enter as plain numbers: a level 0/1/2 per (rollout, visit turn,
positive rubric) and an accepted-match count per judged search turn. Everything else
(usable pages, URL matching, caps, saturation) is decided here, so the same judgments
can be re-scored under other parameters without calling the judge again.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from drcredit.domain.group import (
    AnswerTurn,
    GroupContent,
    Rollout,
    SearchResult,
    SearchTurn,
    VisitTurn,
)
from drcredit.domain.params import ScoringParams
from drcredit.domain.urls import norm_url

VisitKey = tuple[str, int, str]
"""(rollout id, turn index, rubric id) of one visit judgment."""
SearchKey = tuple[str, int]
"""(rollout id, turn index) of one snippet judgment."""


class MissingJudgment(LookupError):
    """Credits were asked for while a judgment they need has not been made."""


# --------------------------------------------------------------------------- matching


def visited_urls(rollout: Rollout) -> set[str]:
    """Normalized URLs called by any visit turn of the rollout."""
    urls: set[str] = set()
    for turn in rollout.turns:
        if isinstance(turn, VisitTurn):
            urls.update(norm_url(u) for u in turn.call.urls)
    urls.discard("")
    return urls


def navigation_links(rollout: Rollout, attribution: Literal["all", "latest"]) -> dict[int, list[int]]:
    """Search turn index -> the later visit turns its results led to (docs/method.md, "Search credit").

    With ``all`` every earlier search that returned a called URL is linked to the visit;
    with ``latest`` only the latest such search before the visit, per called URL. Each
    linked visit appears once per search, in turn order.
    """
    searches: list[tuple[int, set[str]]] = []
    for t, turn in enumerate(rollout.turns):
        if isinstance(turn, SearchTurn):
            searches.append((t, {u for u in (norm_url(r.url) for r in turn.results) if u}))
    links: dict[int, list[int]] = {t: [] for t, _ in searches}
    for v, turn in enumerate(rollout.turns):
        if not isinstance(turn, VisitTurn):
            continue
        called = {u for u in (norm_url(x) for x in turn.call.urls) if u}
        earlier = [(t, urls) for t, urls in searches if t < v]
        if attribution == "all":
            credited = {t for t, urls in earlier if urls & called}
        else:
            credited = set()
            for url in called:
                holders = [t for t, urls in earlier if url in urls]
                if holders:
                    credited.add(max(holders))
        for t in sorted(credited):
            links[t].append(v)
    return links


def eligible_results(rollout: Rollout, turn: SearchTurn, visited: set[str] | None = None) -> list[SearchResult]:
    """Results whose URL matches no visited URL anywhere in the rollout."""
    seen = visited_urls(rollout) if visited is None else visited
    return [r for r in turn.results if norm_url(r.url) not in seen]


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class VisitChain:
    """The visit judgments of one (rollout, rubric), which must run in turn order."""

    rollout_id: str
    rubric_id: str
    turn_indices: tuple[int, ...]


@dataclass(frozen=True)
class SnippetTask:
    """A search turn whose unvisited snippets may need one judge call."""

    rollout_id: str
    turn_index: int
    eligible: tuple[SearchResult, ...]
    #: Visits whose capped credits make up this search's navigation credit.
    navigation_visits: tuple[int, ...]


@dataclass(frozen=True)
class RolloutPlan:
    chains: tuple[VisitChain, ...]
    snippet_tasks: tuple[SnippetTask, ...]
    #: Visits with no usable page: level 0 for every rubric, no judge call.
    deterministic_zero_visits: tuple[int, ...]


def plan_rollout(group: GroupContent, rollout: Rollout, params: ScoringParams) -> RolloutPlan:
    """Which judge calls a rollout needs, and what each snippet call waits for."""
    judged_visits: list[int] = []
    zero_visits: list[int] = []
    for t, turn in enumerate(rollout.turns):
        if isinstance(turn, VisitTurn):
            (judged_visits if turn.usable_pages else zero_visits).append(t)
    chains = tuple(
        VisitChain(rollout.id, rubric.id, tuple(judged_visits)) for rubric in group.positive_rubrics if judged_visits
    )
    tasks: list[SnippetTask] = []
    if params.snippets:
        visited = visited_urls(rollout)
        links = navigation_links(rollout, params.attribution) if params.navigation else {}
        for t, turn in enumerate(rollout.turns):
            if not isinstance(turn, SearchTurn) or turn.error or not turn.results:
                continue
            eligible = eligible_results(rollout, turn, visited)
            if eligible:
                tasks.append(SnippetTask(rollout.id, t, tuple(eligible), tuple(links.get(t, ()))))
    return RolloutPlan(chains, tuple(tasks), tuple(zero_visits))


def calls_on_path(chain_turns: Sequence[int], done: Container[int], gated: Iterable[Sequence[int]]) -> int:
    """The calls on the longest path of dependent calls that still runs through a visit
    chain: its own calls left, or, where a snippet call waits on some of its visits
    (``gated``: each waiting snippet call's navigation visits), the chain's calls up to the
    last of those and the snippet call after them. A chain that ends on a snippet's visit
    is one call longer than its own calls; the scheduler serves longer paths first."""
    left = [u for u in chain_turns if u not in done]
    longest = len(left)
    for visits in gated:
        waited_on = [k for k, u in enumerate(left) if u in visits]
        if waited_on:
            longest = max(longest, waited_on[-1] + 2)
    return longest


SnippetDecision = Literal["call", "skip", "wait"]


def snippet_decision(
    task: SnippetTask, known_visit_credits: Mapping[int, float], params: ScoringParams
) -> SnippetDecision:
    """Whether a snippet call is needed now, never, or once more visits are judged.

    ``known_visit_credits`` holds the capped credit of each visit whose judgments are
    all in. Credits are non-negative, so a partial navigation sum that already reaches
    the cap settles saturation without waiting for the remaining visits.
    """
    if not params.skip_saturated_snippets:
        return "call"
    known = [known_visit_credits[v] for v in task.navigation_visits if v in known_visit_credits]
    if min(params.cap, math.fsum(known)) >= params.cap:
        return "skip"
    if len(known) < len(task.navigation_visits):
        return "wait"
    return "call"


# --------------------------------------------------------------------------- credits


@dataclass(frozen=True)
class TurnCredit:
    """Credit of one turn and its parts; ``credit`` is None for the final answer."""

    index: int
    type: str
    credit: float | None
    visit_credit: float | None = None
    visit_credit_uncapped: float | None = None
    navigation_credit: float | None = None
    snippet_credit: float | None = None
    snippet_matches: int | None = None
    #: Visits whose credit fed this search's navigation credit.
    navigation_visits: tuple[int, ...] = ()
    #: Levels per positive rubric for a visit turn.
    levels: Mapping[str, int] = field(default_factory=dict)
    #: For a search whose needed snippet judgment was never made (replay only): the
    #: credit range it could have; ``credit`` is then the lower end.
    credit_upper_bound: float | None = None
    #: The credit depends on a failed judgment (docs/method.md, "Judge failures"); it is computed as under
    #: policy ``zero`` and flagged, whatever the policy.
    unscorable: bool = False

    @property
    def bounded(self) -> bool:
        return self.credit_upper_bound is not None


@dataclass(frozen=True)
class RolloutCredits:
    rollout_id: str
    turns: tuple[TurnCredit, ...]


@dataclass(frozen=True)
class Judgments:
    """The ordinal judgments of a group, as stored.

    ``visit_levels`` has a level for each judged (rollout, visit, positive rubric); a
    failed judgment counts as level 0. ``snippet_matches`` has the accepted-match count
    of each search turn that was judged (0 when failed). The ``failed_*`` sets name the
    judgments that failed, which make their turns unscorable (docs/method.md, "Judge failures").
    """

    visit_levels: Mapping[VisitKey, int]
    snippet_matches: Mapping[SearchKey, int]
    failed_visits: frozenset[VisitKey] = frozenset()
    failed_snippets: frozenset[SearchKey] = frozenset()


def visit_credit(levels: list[int], params: ScoringParams) -> tuple[float, float]:
    """(capped, uncapped) visit credit from one visit's per-rubric levels."""
    uncapped = math.fsum(params.visit_levels[level] for level in levels)
    return min(params.cap, uncapped), uncapped


def rollout_credits(
    group: GroupContent,
    rollout: Rollout,
    judgments: Judgments,
    params: ScoringParams,
    *,
    allow_missing_snippets: bool = False,
) -> RolloutCredits:
    """Credits of every turn of one rollout (docs/method.md, "Visit credit" to "Turn credit")."""
    rubrics = group.positive_rubrics
    turns = rollout.turns
    out: dict[int, TurnCredit] = {}
    visit_capped: dict[int, float] = {}
    unscorable_visits: set[int] = set()
    for t, turn in enumerate(turns):
        if not isinstance(turn, VisitTurn):
            continue
        if turn.usable_pages:
            levels = {}
            for rubric in rubrics:
                key = (rollout.id, t, rubric.id)
                if key not in judgments.visit_levels:
                    raise MissingJudgment(f"no visit judgment for rollout {rollout.id} turn {t} rubric {rubric.id}")
                levels[rubric.id] = judgments.visit_levels[key]
                if key in judgments.failed_visits:
                    unscorable_visits.add(t)
        else:
            levels = {rubric.id: 0 for rubric in rubrics}
        capped, uncapped = visit_credit(list(levels.values()), params)
        visit_capped[t] = capped
        out[t] = TurnCredit(t, "visit", capped, capped, uncapped, levels=levels, unscorable=t in unscorable_visits)

    links = navigation_links(rollout, params.attribution) if params.navigation else {}
    visited = visited_urls(rollout)
    for t, turn in enumerate(turns):
        if not isinstance(turn, SearchTurn):
            continue
        if turn.error or not turn.results:
            out[t] = TurnCredit(t, "search", 0.0, navigation_credit=0.0, snippet_credit=0.0)
            continue
        linked = tuple(links.get(t, ()))
        nav = min(params.cap, math.fsum(visit_capped[v] for v in linked))
        matches: int | None = 0
        upper: float | None = None
        unscorable = any(v in unscorable_visits for v in linked)
        needs_call = (
            params.snippets
            and bool(eligible_results(rollout, turn, visited))
            and not (params.skip_saturated_snippets and nav >= params.cap)
        )
        if needs_call:
            search_key = (rollout.id, t)
            if search_key in judgments.snippet_matches:
                matches = judgments.snippet_matches[search_key]
                unscorable = unscorable or search_key in judgments.failed_snippets
            elif allow_missing_snippets:
                matches = None
                upper = min(params.cap, nav + params.snippet_weight * len(rubrics))
            else:
                raise MissingJudgment(f"no snippet judgment for rollout {rollout.id} turn {t}")
        snippet = params.snippet_weight * (matches or 0)
        credit = min(params.cap, nav + snippet)
        out[t] = TurnCredit(
            t,
            "search",
            credit,
            navigation_credit=nav,
            snippet_credit=snippet,
            snippet_matches=matches,
            navigation_visits=linked,
            credit_upper_bound=upper,
            unscorable=unscorable,
        )

    result = []
    for t, turn in enumerate(turns):
        if t in out:
            result.append(out[t])
        elif isinstance(turn, AnswerTurn):
            result.append(TurnCredit(t, "answer", None))
        else:
            result.append(TurnCredit(t, turn.type, 0.0))
    return RolloutCredits(rollout.id, tuple(result))


def group_credits(
    group: GroupContent,
    judgments: Judgments,
    params: ScoringParams,
    *,
    allow_missing_snippets: bool = False,
) -> list[RolloutCredits]:
    return [
        rollout_credits(group, r, judgments, params, allow_missing_snippets=allow_missing_snippets)
        for r in group.rollouts
    ]
