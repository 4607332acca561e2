"""The benchmark harness: its workload has the shapes it claims, its simulated judge answers
valid judgments (in process and over HTTP), and its naive call count is what it says."""

from __future__ import annotations

import time
from typing import Any

import pytest
from bench.judge_answers import FACT, snippet_answer, visit_answer
from bench.judge_sim import Simulator, app
from bench.paths import naive_calls
from bench.repeat import BASELINE_ATTEMPTS, repeat_summary, table, timed_baseline
from bench.workload import TURN_LIMIT, make_group, make_step

from drcredit.domain.credit import plan_rollout
from drcredit.domain.group import GroupIn, SearchTurn, VisitTurn
from drcredit.domain.urls import norm_url
from drcredit.domain.verdicts import accept_snippet_matches, validate_visit_answer
from drcredit.judges import prompts
from drcredit.judges.base import RetryPolicy, SnippetJudgeRequest, VisitJudgeRequest
from drcredit.judges.breaker import JudgeUnavailable
from drcredit.judges.openai_judge import OpenAIJudge
from tests.support.builders import group, page, rollout, rubric, search, visit
from tests.support.live import serving

STEP = make_step(4, 8, seed=3)
GROUPS = [GroupIn.model_validate(doc) for doc in STEP]


# ----------------------------------------------------------------------------- workload


def test_the_workload_is_seeded() -> None:
    assert make_step(2, 8, seed=3) == STEP[:2]
    assert make_step(2, 8, seed=4) != STEP[:2]


def test_groups_have_the_stated_rubrics_and_rollout_lengths() -> None:
    for g in GROUPS:
        assert 5 <= len(g.positive_rubrics) <= 8
        assert all(r.weight == -1.0 for r in g.rubrics if not r.positive)
        for r in g.rollouts:
            research = [t for t in r.turns if t.type != "answer"]
            assert 4 <= len(research) <= TURN_LIMIT
            assert isinstance(r.turns[0], SearchTurn)  # nothing to open before a search
            if r.turns[-1].type == "answer":
                assert len(research) < TURN_LIMIT
            else:
                assert len(research) == TURN_LIMIT  # stopped by the turn limit


def test_turns_follow_the_papers_tool_shapes() -> None:
    visits = searches = 0
    for g in GROUPS:
        for r in g.rollouts:
            for t in r.turns:
                if isinstance(t, SearchTurn):
                    searches += 1
                    assert 1 <= len(t.call.queries) <= 2
                    assert 1 <= len(t.results) <= 3 * len(t.call.queries)
                    assert len({res.url for res in t.results}) == len(t.results)
                elif isinstance(t, VisitTurn):
                    visits += 1
                    assert 1 <= len(t.pages) == len(t.call.urls) <= 2
    assert 0.4 <= visits / (visits + searches) <= 0.6  # about half the research turns


def test_the_same_query_returns_the_same_results_across_rollouts() -> None:
    for g in GROUPS:
        seen: dict[str, tuple[str, ...]] = {}
        for r in g.rollouts:
            for t in r.turns:
                if isinstance(t, SearchTurn) and len(t.call.queries) == 1:
                    urls = tuple(res.url for res in t.results)
                    assert seen.setdefault(t.call.queries[0], urls) == urls


def test_visits_mostly_open_what_the_rollouts_own_searches_found() -> None:
    opened = from_search = 0
    for g in GROUPS:
        for r in g.rollouts:
            found: set[str] = set()
            for t in r.turns:
                if isinstance(t, SearchTurn):
                    found |= {norm_url(res.url) for res in t.results}
                elif isinstance(t, VisitTurn):
                    for url in t.call.urls:
                        opened += 1
                        from_search += norm_url(url) in found
    assert from_search / opened >= 0.8


def test_every_turn_has_its_own_reasoning() -> None:
    for g in GROUPS:
        texts = [t.reasoning for r in g.rollouts for t in r.turns if t.type != "answer"]
        assert len(set(texts)) == len(texts)


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_the_page_failure_rate_is_honoured(rate: float) -> None:
    g = GroupIn.model_validate(make_group(11, "g", page_failure_rate=rate))
    pages = [p for r in g.rollouts for t in r.turns if isinstance(t, VisitTurn) for p in t.pages]
    assert pages and all((p.error is not None) == (rate == 1.0) for p in pages)
    assert all(p.usable == (rate == 0.0) for p in pages)


# ----------------------------------------------------------------------------- naive count


def test_the_naive_count_has_every_visit_times_positive_rubric_and_every_search_with_unvisited_results() -> None:
    doc = group(
        rollout(
            "a",
            search(("S1", "https://x.org/1"), ("S2", "https://n.org/1")),
            visit(page("W1", "https://x.org/1", "text")),
            visit(page("W2", "https://y.org/2", "", error="404")),  # a deterministic zero: counted anyway
            search(("S3", "https://x.org/1")),  # every result visited: no call in any count
            reward=1.0,
        ),
        rollout("b", search(("S1", "https://n.org/2")), reward=0.0),
        rubrics=[rubric("R1"), rubric("R2"), rubric("P", weight=-1.0)],
    ).model_dump(mode="json")
    # 2 visits x 2 positive rubrics + a's first search + b's search
    assert naive_calls([doc]) == 2 * 2 + 1 + 1


# ----------------------------------------------------------------------------- simulated judge


def _visit_documents(g: GroupIn) -> list[tuple[dict[str, Any], list[str]]]:
    out = []
    for r in g.rollouts:
        for t in r.turns:
            if isinstance(t, VisitTurn) and t.usable_pages:
                request = VisitJudgeRequest(g.question, g.positive_rubrics[0], (), t)
                out.append((prompts.visit_prompt(request), request.usable_page_ids))
    return [(_document(p.user), ids) for p, ids in out]


def _document(user: str) -> dict[str, Any]:
    import orjson

    value: dict[str, Any] = orjson.loads(user)
    return value


def test_simulated_visit_answers_pass_validation_and_respect_history() -> None:
    leveled = 0
    for doc, usable in _visit_documents(GROUPS[0]):
        answer = visit_answer(doc)
        verdict = validate_visit_answer(answer, usable)
        if verdict.level:
            leveled += 1
            # What is already credited is never credited again ...
            again = visit_answer(dict(doc, support_already_credited=list(verdict.support_points)))
            assert not set(again["support_points"]) & set(verdict.support_points)
            # ... and with every fact of the pages credited, nothing new is left.
            facts = [f"fact {f} holds" for p in doc["visit"]["pages"] for f in FACT.findall(p["evidence"])]
            assert visit_answer(dict(doc, support_already_credited=facts))["level"] == 0
    assert leveled > 0


def test_simulated_snippet_answers_are_accepted_whole() -> None:
    g = GROUPS[0]
    matched = 0
    for r in g.rollouts:
        for task in plan_rollout(g, r, g.params).snippet_tasks:
            request = SnippetJudgeRequest(g.question, tuple(g.positive_rubrics), task.eligible)
            answer = snippet_answer(_document(prompts.snippet_prompt(request).user))
            verdict = accept_snippet_matches(
                answer, [k.id for k in g.positive_rubrics], {res.id: res.snippet for res in task.eligible}
            )
            assert not verdict.rejected
            matched += len(verdict.accepted)
    assert matched > 0


def test_the_simulator_serves_the_openai_protocol_and_counts_requests() -> None:
    g = GROUPS[0]
    turn = next(t for r in g.rollouts for t in r.turns if isinstance(t, VisitTurn) and t.usable_pages)
    sim = Simulator(latency=0.0, sigma=0.0, concurrency=0, error_rate=0.0, seed=1)
    with serving(app(sim), lifespan="off") as url:
        judge = OpenAIJudge(base_url=f"{url}/v1", model="sim")
        result = judge.judge_visit(VisitJudgeRequest(g.question, g.positive_rubrics[0], (), turn))
    assert result.status == "ok" and result.verdict is not None
    assert sim.stats["requests"] == sim.stats["visit"] == 1
    assert sim.stats["prompt_tokens"] > 0


def test_a_simulated_replica_prefills_before_it_answers() -> None:
    """A server prefills a prompt first and then writes the answer: a replica with a
    prefix cache starts the prefill as the request arrives, and the answer comes a
    latency after the prefill ended (it once served the latency first, so its prefill
    lane stood idle for the first latency of every step)."""
    from bench.prefix_cache import PrefixCache

    g = GROUPS[0]
    turn = next(t for r in g.rollouts for t in r.turns if isinstance(t, VisitTurn) and t.usable_pages)
    latency = 0.4
    sim = Simulator(
        latency=latency,
        sigma=0.0,
        concurrency=0,
        error_rate=0.0,
        seed=1,
        prefix=PrefixCache(capacity_blocks=4096, block_chars=256, prefill_s_per_token=1e-6),
    )
    with serving(app(sim), lifespan="off") as url:
        judge = OpenAIJudge(base_url=f"{url}/v1", model="sim")
        sent = time.time()
        result = judge.judge_visit(VisitJudgeRequest(g.question, g.positive_rubrics[0], (), turn))
        answered = time.time()
    assert result.status == "ok"
    lane = sim.prefix.stats if sim.prefix is not None else {}
    assert lane["lane_prefills"] == 1
    assert 0 <= lane["lane_started_at"] - sent < latency / 2  # prefilled on arrival, not after the latency
    assert answered - lane["lane_ended_at"] >= latency * 0.95  # then the latency


def test_a_failing_simulator_answers_500_and_the_judge_is_unavailable_past_the_deadline() -> None:
    """Every request a 500: the judgment's retries open the breaker, single probes follow,
    and past the outage deadline the judge is unavailable (an outage is not a score)."""
    g = GROUPS[0]
    turn = next(t for r in g.rollouts for t in r.turns if isinstance(t, VisitTurn) and t.usable_pages)
    sim = Simulator(latency=0.0, sigma=0.0, concurrency=0, error_rate=1.0, seed=1)
    with serving(app(sim), lifespan="off") as url:
        judge = OpenAIJudge(
            base_url=f"{url}/v1",
            model="sim",
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01),
            outage_deadline_s=1.2,
        )
        with pytest.raises(JudgeUnavailable, match="500"):
            judge.judge_visit(VisitJudgeRequest(g.question, g.positive_rubrics[0], (), turn))
    assert 3 <= sim.stats["errors"] <= 5


def test_judged_outcome_workload_and_simulated_outcome_answers() -> None:
    """The outcome bench: reports cite usable pages, rewards are left to the service, and
    the simulator answers both outcome prompts validly."""
    from bench.judge_answers import citation_answer, rubric_answer
    from bench.workload import with_judged_outcomes

    from drcredit.domain.outcome import report_facts
    from drcredit.domain.verdicts import validate_score

    doc = with_judged_outcomes(make_group(3, "oj"))
    group = GroupIn.model_validate(doc)
    assert group.params.outcome_source == "judge"
    assert all(r.outcome_reward is None for r in group.rollouts)
    cited = [report_facts(r) for r in group.rollouts]
    assert any(c.citations and all(x.scoreable for x in c.citations) for c in cited)
    report = next(r.turns[-1].answer for r in group.rollouts if r.turns and r.turns[-1].type == "answer")
    rubric = {"id": group.rubrics[0].id, "type": "factual", "description": "d"}
    assert 0 <= validate_score(rubric_answer({"rubric_item": rubric, "report": report}), 4).score <= 4
    claim = cited[0].citations[0] if cited[0].citations else None
    if claim is not None:
        pages = {p.id: p for t in group.rollouts[0].turns for p in getattr(t, "usable_pages", [])}
        evidence = [{"url": pages[p].url, "evidence": pages[p].evidence} for p in claim.pages]
        assert validate_score(citation_answer({"claim": claim.claim, "cited_pages": evidence}), 2).score == 2


def test_a_failed_baseline_scoring_is_recorded_and_the_step_scored_again() -> None:
    """The comparator's failure is kept with the run, and the ratio is taken from a
    complete scoring: the judge refuses every request between the first and second
    reset (the first attempt, after its client's own retries) and answers after."""
    sim = Simulator(latency=0.0, sigma=0.0, concurrency=0, error_rate=0.0, seed=1)
    inner = app(sim)
    resets = 0

    async def flaky(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal resets
        if scope["type"] == "http" and scope["path"] == "/reset":
            resets += 1
        elif scope["type"] == "http" and scope["path"] == "/v1/chat/completions" and resets == 1:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b'{"error": {"message": "down"}}'})
            return
        await inner(scope, receive, send)

    step = [make_group(3, "flaky", rollouts=2)]
    with serving(flaky, lifespan="off") as url:
        seconds, errors = timed_baseline(url, step, concurrency=16)
    assert resets == 2
    assert len(errors) == 1 and errors[0].startswith("InternalServerError")
    assert seconds is not None and seconds > 0
    assert sim.stats["requests"] > 0  # the second attempt was answered by the simulator


def test_a_baseline_that_never_completes_gives_no_time() -> None:
    sim = Simulator(latency=0.0, sigma=0.0, concurrency=0, error_rate=1.0, seed=1)
    step = [make_group(3, "down", rollouts=2)]
    with serving(app(sim), lifespan="off") as url:
        seconds, errors = timed_baseline(url, step, concurrency=16)
    assert seconds is None
    assert len(errors) == BASELINE_ATTEMPTS


def test_the_repeat_summary_takes_the_baseline_over_the_runs_where_it_completed() -> None:
    def run(ratio: float, baseline: float | None, errors: int) -> dict[str, Any]:
        out: dict[str, Any] = {"ratio_to_bound": ratio, "client_after_last_done_s": 0.01, "reference_ms": 60.0}
        if baseline is not None:
            out["ratio_to_baseline"] = baseline
        if errors:
            out["baseline_errors"] = ["APIConnectionError (ReadError) after 60.0 s"] * errors
        return out

    rep = repeat_summary([run(1.1, 0.2, 0), run(1.2, None, 3), run(1.3, 0.4, 1)], 2, False, False)
    assert rep["ratio_to_bound"]["max"] == 1.3
    assert rep["ratio_to_baseline"]["median"] == pytest.approx(0.3)  # of 0.2 and 0.4 only
    assert rep["ratio_to_baseline"]["max"] == 0.4
    assert (rep["baseline_runs"], rep["baseline_failures"]) == (2, 4)
    assert "baseline complete in 2 of 3 runs; 4 attempts failed" in table(rep)
    clean = repeat_summary([run(1.1, 0.2, 0)], 2, False, False)
    assert clean["baseline_failures"] == 0 and "attempts failed" not in table(clean)
    alone = repeat_summary([run(1.1, None, 0)], 2, False, False)
    assert "ratio_to_baseline" not in alone and "baseline_runs" not in alone


def test_the_prefix_cache_counts_what_must_be_prefilled_at_least_once() -> None:
    """Two prompts sharing their first two blocks: the second prefills only its tail;
    what must be prefilled is the two distinct blocks and both tails (no cache holds a
    prompt's last partial block)."""
    import asyncio

    from bench.prefix_cache import PrefixCache, prompt_text

    shared = "p" * 600
    first = [{"role": "user", "content": shared + "a" * 100}]
    second = [{"role": "user", "content": shared + "b" * 100}]
    cache = PrefixCache(capacity_blocks=64, block_chars=256)
    # "<|user|>" (8) + 700 + "<|end|>" (7) = 715 characters: 2 full blocks and a tail of 203
    assert len(prompt_text(first)) == 715
    got = asyncio.run(cache.prefill(first, 715 // 4))
    assert got == 0
    assert asyncio.run(cache.prefill(second, 715 // 4)) == 512 // 4  # two blocks cached
    # distinct blocks: the two shared ones (the second prompt's blocks are the same two)
    assert cache.stats["distinct_prefilled_tokens"] == 2 * 64
    assert cache.stats["required_prefilled_tokens"] == 2 * 64 + 2 * (203 // 4)
    assert cache.stats["prefilled_tokens"] == 178 + (178 - 128)


def test_the_prefill_lane_keeps_its_stated_cost_under_load() -> None:
    """Fifty prompts sent at once through one lane: each is prefilled after the previous
    one, on the lane's own schedule, so the last ends 50 x its cost after the first
    began, however late the event loop woke each sleep (the sleeps' lag once added up
    to 5% of a step's prefill)."""
    import asyncio

    from bench.prefix_cache import PrefixCache

    cost_s, tokens, n = 1e-5, 100, 50  # 1 ms a prompt

    async def run() -> tuple[float, float, float]:
        cache = PrefixCache(capacity_blocks=4096, block_chars=256, prefill_s_per_token=cost_s)
        loop = asyncio.get_running_loop()
        began = loop.time()
        prompts = [[{"role": "user", "content": f"{i:04d}" * 100}] for i in range(n)]
        await asyncio.gather(*(cache.prefill(p, tokens) for p in prompts))
        return began, cache._free_at, loop.time()

    began, last_end, finished = asyncio.run(run())
    assert 0 <= last_end - n * tokens * cost_s - began < 0.01  # one after another from the first arrival
    assert finished >= last_end  # and never two at once


def test_the_prefill_lane_reports_its_timeline() -> None:
    """Ten prompts at once, then one after the lane has emptied: the lane reports what a
    step's anatomy needs (bench.prefix_reuse's ``lanes``). Each prompt is 2 ms of prefill;
    the k-th of the ten waits k x 2 ms (0 + 2 + ... + 18 = 90 ms in all, 18 ms at most),
    the eleventh none; the lane is busy 11 x 2 ms and idle for the pause between."""
    import asyncio
    import time

    from bench.prefix_cache import PrefixCache
    from bench.prefix_reuse import lane_timeline

    cost_s, tokens, pause_s = 2e-5, 100, 0.2  # 2 ms a prompt

    async def run() -> PrefixCache:
        cache = PrefixCache(capacity_blocks=4096, block_chars=256, prefill_s_per_token=cost_s)
        prompts = [[{"role": "user", "content": f"{i:04d}" * 100}] for i in range(11)]
        await asyncio.gather(*(cache.prefill(p, tokens) for p in prompts[:10]))
        await asyncio.sleep(pause_s)
        await cache.prefill(prompts[10], tokens)
        return cache

    posted = time.time()
    cache = asyncio.run(run())
    stats = cache.stats
    assert stats["lane_prefills"] == 11
    assert abs(stats["lane_busy_s"] - 11 * 0.002) < 1e-9
    assert abs(stats["lane_wait_s"] - 0.090) < 0.005  # the ten arrive within a few ms of each other
    assert abs(stats["lane_max_wait_s"] - 0.018) < 0.005
    lane = lane_timeline({**stats, "lane_intervals": cache.intervals}, posted)
    assert lane is not None
    assert pause_s <= lane["idle_s"] < pause_s + 0.05
    assert 0 <= lane["first_s"] < lane["last_s"]
    assert abs(lane["mean_wait_s"] - 0.090 / 11) < 0.001
    assert sum(lane["busy_per_s"]) == pytest.approx(11 * 0.002, abs=0.011)  # rounded to 0.01 a second
    cache.reset()
    assert cache.intervals == []
    assert lane_timeline(dict(cache.stats), posted) is None  # nothing prefilled since the reset


def test_the_lanes_busy_share_is_counted_per_second_after_the_post() -> None:
    """A prefill from 0.5 s to 1.25 s and one from 2.0 s to 2.5 s after the POST: half of
    the first second, a quarter of the second, half of the third."""
    from bench.prefix_reuse import busy_per_second

    posted = 1000.0
    assert busy_per_second([[1000.5, 1001.25], [1002.0, 1002.5]], posted) == [0.5, 0.25, 0.5]
    # one prefill across three seconds, and a second starting before the POST counts from it
    assert busy_per_second([[999.5, 1000.25], [1000.75, 1003.0]], posted) == [0.5, 1.0, 1.0]
    assert busy_per_second([], posted) == []
