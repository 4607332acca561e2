"""The judge interface and the retry/validation loop every backend shares.

A backend only turns a prompt into text (:meth:`Judge.acomplete`); parsing, the
method's validation, retries with backoff and the per-attempt record live here, so the offline
and OpenAI-compatible backends fail, retry and report in exactly the same way.

The loop is asynchronous: a worker keeps hundreds of judgments in flight on one event
loop, and a judgment waiting on the model costs no thread. The synchronous
``judge_visit``/``judge_snippets`` run the same loop to completion for callers without
one (tests, one-off scripts).
"""

from __future__ import annotations

import asyncio
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from drcredit.domain.verdicts import (
    InvalidAnswer,
    ScoreVerdict,
    SnippetVerdict,
    VisitVerdict,
    accept_snippet_matches,
    validate_score,
    validate_visit_answer,
)
from drcredit.judges import outcome_prompts, prompts

# Re-exported: what a judgment comes to is part of the judge's interface.
from drcredit.judges.answers import parse_json_answer as parse_json_answer
from drcredit.judges.attempts import Attempt as Attempt
from drcredit.judges.attempts import AttemptPlan as AttemptPlan
from drcredit.judges.attempts import Rejected, next_plan
from drcredit.judges.breaker import UNREACHABLE_OUTCOMES, CircuitBreaker
from drcredit.judges.fleet.router import Fleet

# Re-exported: the request types are part of the judge's interface.
from drcredit.judges.requests import (
    CitationJudgeRequest as CitationJudgeRequest,
)
from drcredit.judges.requests import (
    JudgeKind as JudgeKind,
)
from drcredit.judges.requests import (
    Prompt as Prompt,
)
from drcredit.judges.requests import (
    RubricJudgeRequest as RubricJudgeRequest,
)
from drcredit.judges.requests import (
    SnippetJudgeRequest as SnippetJudgeRequest,
)
from drcredit.judges.requests import (
    VisitJudgeRequest as VisitJudgeRequest,
)
from drcredit.judges.results import Completion as Completion
from drcredit.judges.results import FatalJudgeError as FatalJudgeError
from drcredit.judges.results import JudgeResult as JudgeResult
from drcredit.judges.results import RetryableError as RetryableError
from drcredit.judges.results import RetryPolicy as RetryPolicy
from drcredit.judges.results import V, _JudgeDown


class Judge(ABC):
    """A judge backend; subclasses implement :meth:`acomplete` only."""

    backend: str = "abstract"
    #: The endpoints a remote judge calls (None: a judge without any, the offline one).
    fleet: Fleet | None = None

    def __init__(
        self,
        model: str,
        retry: RetryPolicy | None = None,
        outage_deadline_s: float = 600.0,
        temperature: float = 0.0,
        prompt_layout: str = prompts.DEFAULT_LAYOUT,
    ):
        self.model = model
        self.retry = retry or RetryPolicy()
        self.temperature = temperature
        #: The order of the prompts' parts (drcredit.judges.prompts.LAYOUTS).
        self.prompt_layout: prompts.PromptLayout = prompts.check_layout(prompt_layout)
        self.breaker = CircuitBreaker(self.endpoint, deadline_s=outage_deadline_s)

    @property
    def endpoint(self) -> str:
        """What the breaker guards and outages are reported under (a URL for remote judges)."""
        return self.backend

    @abstractmethod
    async def acomplete(self, prompt: Prompt, plan: AttemptPlan) -> Completion:
        """Make one attempt at ``prompt`` as ``plan`` says; raise :class:`RetryableError`
        or :class:`FatalJudgeError`. Exchanges that did not end the attempt (a call moved
        to another endpoint, a 429 waited out) go into ``plan.tries``."""

    async def awarm(self) -> None:  # noqa: B027 - a concrete default, not an abstract hook
        """Prepare for the first call before work arrives (connections, what the servers
        say of themselves), so a fresh worker's first step does not wait for it; the
        default has nothing to prepare."""

    async def aclose(self) -> None:  # noqa: B027 - a concrete default, not an abstract hook
        """Release the connections held for the running event loop; the default holds none."""

    def close(self) -> None:  # noqa: B027 - a concrete default, not an abstract hook
        """Release every connection; the default holds none."""

    # ------------------------------------------------------------------ requests

    @property
    def sampling(self) -> dict[str, Any]:
        """Everything besides the model and the messages that reaches the server and can
        change its answer (part of :meth:`request_key`)."""
        return {"temperature": self.temperature}

    def request_key(self, prompt: Prompt) -> str:
        """The request's digest: equal for identical requests (a group's twins, the
        tenant's reuse store), different when anything reaching the judge differs."""
        return prompt.digest(self.model, self.sampling)

    def visit_prompt(self, request: VisitJudgeRequest) -> Prompt:
        return prompts.visit_prompt(request, self.prompt_layout)

    def snippet_prompt(self, request: SnippetJudgeRequest) -> Prompt:
        return prompts.snippet_prompt(request, self.prompt_layout)

    async def ajudge_visit(self, request: VisitJudgeRequest, prompt: Prompt | None = None) -> JudgeResult[VisitVerdict]:
        usable = request.usable_page_ids
        return await self._arun(
            prompt or self.visit_prompt(request), lambda answer: validate_visit_answer(answer, usable)
        )

    async def ajudge_snippets(
        self, request: SnippetJudgeRequest, prompt: Prompt | None = None
    ) -> JudgeResult[SnippetVerdict]:
        rubric_ids = [r.id for r in request.rubrics]
        snippets = {r.id: r.snippet for r in request.results}
        return await self._arun(
            prompt or self.snippet_prompt(request), lambda answer: accept_snippet_matches(answer, rubric_ids, snippets)
        )

    def rubric_prompt(self, request: RubricJudgeRequest) -> Prompt:
        return outcome_prompts.rubric_prompt(request, self.prompt_layout)

    def citation_prompt(self, request: CitationJudgeRequest) -> Prompt:
        return outcome_prompts.citation_prompt(request, self.prompt_layout)

    async def ajudge_rubric(
        self, request: RubricJudgeRequest, prompt: Prompt | None = None
    ) -> JudgeResult[ScoreVerdict]:
        return await self._arun(prompt or self.rubric_prompt(request), lambda answer: validate_score(answer, 4))

    async def ajudge_citation(
        self, request: CitationJudgeRequest, prompt: Prompt | None = None
    ) -> JudgeResult[ScoreVerdict]:
        return await self._arun(prompt or self.citation_prompt(request), lambda answer: validate_score(answer, 2))

    def judge_rubric(self, request: RubricJudgeRequest) -> JudgeResult[ScoreVerdict]:
        return self._run_to_completion(self.ajudge_rubric(request))

    def judge_citation(self, request: CitationJudgeRequest) -> JudgeResult[ScoreVerdict]:
        return self._run_to_completion(self.ajudge_citation(request))

    def judge_visit(self, request: VisitJudgeRequest) -> JudgeResult[VisitVerdict]:
        return self._run_to_completion(self.ajudge_visit(request))

    def judge_snippets(self, request: SnippetJudgeRequest) -> JudgeResult[SnippetVerdict]:
        return self._run_to_completion(self.ajudge_snippets(request))

    def _run_to_completion(self, judgment: Awaitable[JudgeResult[V]]) -> JudgeResult[V]:
        async def run() -> JudgeResult[V]:
            try:
                return await judgment
            finally:
                await self.aclose()

        return asyncio.run(run())

    # ------------------------------------------------------------------ the loop

    async def _arun(self, prompt: Prompt, validate: Callable[[Any], V]) -> JudgeResult[V]:
        """Judge until an answer is valid, the attempts run out, or the judge is gone.

        A round of attempts that ends without reaching the judge opens the breaker: the
        judgment waits for the judge to come back and starts a fresh round, so an outage
        never spends its attempts. While open, one waiter at a time probes with a single
        attempt. Past the outage deadline :class:`JudgeUnavailable` is raised.
        """
        result: JudgeResult[V] = JudgeResult(
            prompt.kind, "failed", self.model, self.backend, None, prompt_layout=prompt.layout
        )
        while True:
            probe = await self.breaker.acquire()
            try:
                outcome = await self._round(prompt, validate, result, probe)
            finally:
                if probe:
                    self.breaker.probe_finished()
            if outcome != "unreachable":
                return result
            last = result.attempts[-1] if result.attempts else None
            self.breaker.unreachable(last.error or last.outcome if last else "unreachable", probe=probe)

    async def _round(
        self, prompt: Prompt, validate: Callable[[Any], V], result: JudgeResult[V], probe: bool
    ) -> Literal["ok", "failed", "unreachable"]:
        """One round of attempts with retries and backoff, recorded into ``result``."""
        attempts = 1 if probe else self.retry.max_attempts
        first = len(result.attempts)
        rejected: Rejected | None = None
        #: Endpoints that gave this judgment an answer it rejected (its retries go elsewhere).
        rejected_by: frozenset[str] = frozenset()

        async def one_attempt() -> tuple[Any, V]:
            nonlocal rejected, rejected_by
            if not probe and self.breaker.is_open:
                raise _JudgeDown()  # another judgment found the judge gone: wait, do not spend
            plan = next_plan(self.temperature, rejected, probe=probe, avoid=rejected_by)
            started = time.perf_counter()
            try:
                completion = await self.acomplete(prompt, plan)
            except RetryableError as exc:
                tried = Attempt(
                    0,
                    exc.outcome,
                    time.perf_counter() - started,
                    exc.prompt_tokens,
                    error=str(exc),
                    endpoint=exc.endpoint,
                    estimated=exc.prompt_tokens > 0,
                )
                self._record(result, plan, tried)
                if exc.outcome not in UNREACHABLE_OUTCOMES:
                    self.breaker.reachable()
                if exc.outcome == "invalid" and exc.endpoint is not None:
                    rejected_by |= {exc.endpoint}
                raise
            except FatalJudgeError as exc:
                self._record(result, plan, Attempt(0, exc.outcome, time.perf_counter() - started, error=str(exc)))
                self.breaker.reachable()
                raise
            self.breaker.reachable()
            attempt = Attempt(
                0,
                "ok",
                time.perf_counter() - started,
                completion.prompt_tokens,
                completion.completion_tokens,
                cached_tokens=completion.cached_tokens,
                endpoint=completion.endpoint,
                model=completion.model,
                finish_reason=completion.finish_reason,
                waited_s=completion.waited_s,
            )
            self._record(result, plan, attempt)
            try:
                cut_off = completion.cut_off()
                if cut_off is not None:
                    rejected = Rejected(completion.text, cut_off, not completion.context_ran_out, completion.max_tokens)
                    raise InvalidAnswer(cut_off)
                answer = parse_json_answer(completion.text)
                verdict = validate(answer)
            except InvalidAnswer as exc:
                attempt.outcome, attempt.error = "invalid", str(exc)
                if rejected is None or rejected.reason != str(exc):
                    rejected = Rejected(completion.text, str(exc))
                if completion.endpoint is not None:
                    rejected_by |= {completion.endpoint}
                raise RetryableError("invalid", str(exc)) from exc
            return answer, verdict

        def exhausted() -> Literal["failed", "unreachable"]:
            if len(result.attempts) > first and result.attempts[-1].outcome in UNREACHABLE_OUTCOMES:
                return "unreachable"
            self._failed(result)
            return "failed"

        def fatal(exc: FatalJudgeError) -> Literal["failed"]:
            result.failure_reason = f"{exc.outcome}: {exc}"
            return "failed"

        # The first attempt runs directly: tenacity's machinery costs more CPU than the
        # rest of a successful judgment's bookkeeping, and is only needed for a retry.
        try:
            answer, verdict = await one_attempt()
        except RetryableError:
            if attempts <= 1:
                return exhausted()
        except FatalJudgeError as exc:
            return fatal(exc)
        except _JudgeDown:
            return "unreachable"
        else:
            result.status, result.answer, result.verdict = "ok", answer, verdict
            return "ok"
        await asyncio.sleep(self._first_backoff())
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts - 1),
            # Exponential backoff with up to one initial interval of jitter, so retries
            # from many chains do not hit a recovering server in lockstep; this loop's
            # first wait follows the second attempt, so it starts at twice the initial.
            wait=wait_exponential(multiplier=2 * self.retry.backoff_initial_s, max=self.retry.backoff_max_s)
            + wait_random(0, self.retry.backoff_initial_s),
            retry=retry_if_exception(lambda e: isinstance(e, RetryableError)),
            reraise=False,
        )
        try:
            answer, verdict = await retrying(one_attempt)
        except RetryError:
            return exhausted()
        except FatalJudgeError as exc:
            return fatal(exc)
        except _JudgeDown:
            return "unreachable"
        result.status, result.answer, result.verdict = "ok", answer, verdict
        return "ok"

    @staticmethod
    def _record(result: JudgeResult[V], plan: AttemptPlan, attempt: Attempt) -> None:
        """Append the attempt's unspent exchanges, then the attempt itself, numbered."""
        for item in [*plan.tries, attempt]:
            item.number = len(result.attempts) + 1
            result.attempts.append(item)

    def _first_backoff(self) -> float:
        """The wait before the first retry: the policy's initial interval plus its jitter."""
        initial = self.retry.backoff_initial_s
        return min(initial, self.retry.backoff_max_s) + random.uniform(0, initial)

    @staticmethod
    def _failed(result: JudgeResult[V]) -> JudgeResult[V]:
        last = result.attempts[-1]
        spent = sum(1 for a in result.attempts if a.spent)
        result.failure_reason = f"{last.outcome} after {spent} attempts: {last.error}"
        return result
