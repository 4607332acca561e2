"""One judgment's attempts: what each one was, and what the next one changes.

Every HTTP exchange of a judgment is recorded as an :class:`Attempt` (its outcome,
latency, tokens and which endpoint answered). Only some of them are *spent* against the
judgment's ``DRCREDIT_JUDGE_MAX_ATTEMPTS``: a call moved to another endpoint after a
refused connection, or held back by a 429, is recorded but costs the judgment nothing.

A retry after a bad answer is not the same request again: at temperature 0 a judge
answers a repeated question token for token as before. :func:`next_plan` changes what
can change the outcome: the rejected answer and the reason go back to the judge, an
answer cut off at ``max_tokens`` gets twice the room (as far as the context allows, and
never less than the judge's setting: a first answer cut short where the prompt's size was
only estimated gets the room known once the server has counted it), and the temperature
rises a little. It also goes elsewhere: an endpoint whose answer was rejected is avoided
by the judgment's next attempts while another endpoint is in the rotation (a replica
answering garbage would otherwise, answering fastest, take every retry and fail the
judgment while a healthy one waits).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Temperature of a retry after a bad answer (when the judge's own is lower).
RETRY_TEMPERATURE = 0.3


@dataclass
class Attempt:
    number: int
    #: ok | invalid | timeout | connection | rate_limited | server_error | fatal | context_length
    outcome: str
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    #: Prompt tokens the server served from its prefix cache.
    cached_tokens: int = 0
    #: The endpoint that took the call and the model it said answered.
    endpoint: str | None = None
    model: str | None = None
    #: The server's finish_reason (``length``: see ``error`` for which limit).
    finish_reason: str | None = None
    #: Counted against the judgment's attempts (False: moved to another endpoint, or
    #: held back by a rate limit).
    spent: bool = True
    #: The tokens are the platform's estimate (the call was cut off before any usage came).
    estimated: bool = False
    #: Of ``latency_s``, what the attempt spent on this side before its answering
    #: exchange (a place on an endpoint, a rate-limit turn, a connection, tries moved
    #: on the way); 0 for a failed attempt.
    waited_s: float = 0.0


@dataclass
class AttemptPlan:
    """What one attempt sends, beyond the prompt itself."""

    temperature: float
    #: Completion tokens to allow (None: the judge's setting), before the context's bound.
    max_tokens: int | None = None
    #: The previous answer and why it was rejected, shown to the judge.
    feedback: tuple[str, str] | None = None
    #: The judge's breaker is probing: try an endpoint out of the rotation.
    probe: bool = False
    #: Exchanges of this attempt that did not end it (failovers, 429s), in order.
    tries: list[Attempt] = field(default_factory=list)
    #: Endpoints whose answers this judgment rejected: not asked again while another
    #: endpoint can take the call.
    avoid: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Rejected:
    """An answer the judge gave that did not validate (or was cut off)."""

    text: str
    reason: str
    #: Cut off at ``max_tokens`` (not by the context): more room may complete it.
    needs_room: bool = False
    max_tokens: int | None = None


def next_plan(
    temperature: float, rejected: Rejected | None, *, probe: bool = False, avoid: frozenset[str] = frozenset()
) -> AttemptPlan:
    """The plan of an attempt: the first as configured; after a rejected answer, one
    that can come out differently (``avoid``: the endpoints that gave rejected answers)."""
    if rejected is None:
        return AttemptPlan(temperature, probe=probe, avoid=avoid)
    room = 2 * rejected.max_tokens if rejected.needs_room and rejected.max_tokens else None
    return AttemptPlan(
        max(temperature, RETRY_TEMPERATURE),
        max_tokens=room,
        feedback=(rejected.text, rejected.reason),
        probe=probe,
        avoid=avoid,
    )
