"""What one attempt and one judgment come to: a backend's completion, the errors that
end an attempt, a judgment's result with every attempt, and the retry policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from drcredit.domain.verdicts import ScoreVerdict, SnippetVerdict, VisitVerdict
from drcredit.judges.attempts import Attempt
from drcredit.judges.requests import JudgeKind

V = TypeVar("V", VisitVerdict, SnippetVerdict, ScoreVerdict)


@dataclass(frozen=True)
class Completion:
    """A backend's raw answer to one attempt."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    cached_tokens: int = 0
    #: The endpoint that answered and the model it said it ran.
    endpoint: str | None = None
    model: str | None = None
    #: The completion limit the request carried, and the endpoint's context window.
    max_tokens: int | None = None
    context_tokens: int | None = None
    #: ``max_tokens`` was lowered below the judge's setting to fit the context window.
    context_bound: bool = False
    #: Seconds of the attempt spent on this side before the answering exchange: waiting
    #: for a place on an endpoint, a rate-limit turn or a connection, and tries refused
    #: or moved on the way (the rest is the server's answer time).
    waited_s: float = 0.0

    @property
    def context_ran_out(self) -> bool:
        """Cut off because prompt and answer filled the endpoint's context window."""
        return bool(
            self.finish_reason == "length"
            and self.context_tokens
            and self.prompt_tokens + self.completion_tokens >= self.context_tokens - 1
        )

    def cut_off(self) -> str | None:
        """Why the answer ended early, if it did: the context ran out, or ``max_tokens``."""
        if self.finish_reason != "length":
            return None
        if self.context_ran_out:
            return (
                f"cut off: the context window ({self.context_tokens} tokens) ran out after"
                f" {self.completion_tokens} answer tokens on a {self.prompt_tokens}-token prompt"
            )
        if self.context_bound:
            return (
                f"cut off at {self.max_tokens} answer tokens, the room kept for the answer within the context"
                f" window ({self.context_tokens} tokens) after the {self.prompt_tokens}-token prompt"
            )
        return f"cut off at the max_tokens limit ({self.max_tokens or self.completion_tokens} tokens)"


class RetryableError(Exception):
    """An attempt failed in a way another attempt may fix (connection, 429, 5xx, timeout).

    ``prompt_tokens``: the platform's estimate of the prompt tokens the judge spent on a
    call cut off before any usage came back (a timeout); ``endpoint``: where it went.
    """

    def __init__(self, outcome: str, message: str, *, prompt_tokens: int = 0, endpoint: str | None = None):
        super().__init__(message)
        self.outcome = outcome
        self.prompt_tokens = prompt_tokens
        self.endpoint = endpoint


class FatalJudgeError(Exception):
    """An attempt failed in a way retrying cannot fix (bad credentials, unknown model, a
    prompt longer than the context): the judgment fails at once with ``outcome``."""

    def __init__(self, message: str, outcome: str = "fatal"):
        super().__init__(message)
        self.outcome = outcome


class _JudgeDown(Exception):
    """The breaker opened while a round was under way: stop it without spending attempts."""


@dataclass
class JudgeResult(Generic[V]):
    """One judgment: the validated verdict, or the reason it failed, and every attempt."""

    kind: JudgeKind
    status: Literal["ok", "failed"]
    model: str
    backend: str
    verdict: V | None
    answer: Any = None
    failure_reason: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    #: A reused answer (an identical request's, stored): (endpoint, model) that gave it.
    reused_from: tuple[str | None, str | None] | None = None
    #: The layout of the prompt asked (drcredit.judges.prompts.LAYOUTS).
    prompt_layout: str | None = None
    #: Answered from the tenant's store of earlier answers (no call made for it).
    reused: bool = False

    @property
    def latency_s(self) -> float:
        return sum(a.latency_s for a in self.attempts)

    @property
    def prompt_tokens(self) -> int:
        return sum(a.prompt_tokens for a in self.attempts)

    @property
    def completion_tokens(self) -> int:
        return sum(a.completion_tokens for a in self.attempts)

    @property
    def cached_tokens(self) -> int:
        return sum(a.cached_tokens for a in self.attempts)

    @property
    def estimated_prompt_tokens(self) -> int:
        """The part of :attr:`prompt_tokens` the platform estimated (calls cut off)."""
        return sum(a.prompt_tokens for a in self.attempts if a.estimated)

    @property
    def answered_by(self) -> tuple[str | None, str | None]:
        """(endpoint, model) of the attempt that gave the judgment's answer (or the last;
        for a reused answer, the one that gave it)."""
        if not self.attempts and self.reused_from is not None:
            return self.reused_from
        for a in reversed(self.attempts):
            if a.outcome == "ok":
                return a.endpoint, a.model
        last = self.attempts[-1] if self.attempts else None
        return (last.endpoint, last.model) if last else (None, None)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 20.0
