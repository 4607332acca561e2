"""What the fleet learns from each exchange: health, limits, rate limits.

An answer at normal latency from a busy endpoint grows its limit; a 429, a 5xx or a
connect failure cuts it; answers slowed by a queue inside the server set it to the
slots they imply, and a timeout while the server answers others lowers it without
counting against the endpoint's health (:mod:`~drcredit.judges.fleet.limits`);
a 429 teaches the endpoint's rate (:mod:`~drcredit.judges.fleet.rates`) and its
``retry-after`` is waited out (by the endpoint until a pace is known, then by the refused
call); failures without an answer take it out of the rotation, connection failures
once a health check fails too (:mod:`~drcredit.judges.fleet.health`). What is learned
goes to the shared record at once (:mod:`~drcredit.judges.fleet.sharing`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from drcredit import metrics
from drcredit.judges.fleet import limits
from drcredit.judges.fleet.latency import LatencyWatch
from drcredit.judges.fleet.rates import (
    ACCEPTED_WINDOW_S,
    MAX_SEND_GAP_S,
    RATE_CUT,
    RATE_CUT_SPACING_S,
    RateHeaders,
    fleet_rpm,
    inferred_rpm,
    longest_pause,
)
from drcredit.judges.fleet.state import Endpoint, Lease
from drcredit.judges.fleet.store import EndpointRecord, FleetStore, with_facts

log = logging.getLogger("drcredit.judges.fleet")

#: A 429 without retry-after is taken to ask this long (of the endpoint while no pace is
#: known, else of the refused call).
DEFAULT_COOL_S = 1.0


class Learning:
    """The fleet's handling of exchange outcomes (a part of :class:`~drcredit.judges.fleet.router.Fleet`)."""

    endpoints: list[Endpoint]
    by_url: dict[str, Endpoint]
    store: FleetStore
    listeners: list[Callable[[Endpoint, bool], None]]
    _clock: Callable[[], float]
    _background: set[asyncio.Task[Any]]

    if TYPE_CHECKING:  # provided by the Fleet and its other parts

        def _dispatch(self) -> None: ...

        def _adopt(self, e: Endpoint, record: EndpointRecord) -> None: ...

        def _check(self, e: Endpoint) -> None: ...

    def _count(self, e: Endpoint, outcome: str) -> None:
        e.counts[outcome] += 1
        metrics.JUDGE_ENDPOINT_RESPONSES.labels(e.url, outcome).inc()

    def answered(
        self, lease: Lease, latency_s: float | None, rates: RateHeaders | None = None, first_s: float | None = None
    ) -> None:
        """The endpoint answered (any HTTP answer but a 429 or a 5xx); ``latency_s`` of a
        completion (None: an error answer, which says nothing of the server's pace);
        ``first_s``: when its first streamed event came (None: not streamed)."""
        e = lease.endpoint
        if latency_s is not None:
            e.prefill.answered(first_s, latency_s)
        self._count(e, "answered")
        if e.health.answered(self._clock()):
            self._notify(e, True)  # back from an outage, with the limit it had before it
        if lease.epoch >= e.record.limit.epoch:
            # Sent under the limit as it stands: a late answer to a call sent before a cut
            # (a replica's last answers read after its kill cut it) says nothing of it.
            e.answered_limit = e.record.limit.limit
        if latency_s is None:
            return
        e.proven = max(e.proven, e.in_flight)
        state = e.record.limit
        if lease.epoch < state.epoch:
            # Sent before the last cut: its latency is the old load's, not the new limit's.
            e.latency.track(latency_s)
            if rates is not None:
                self._learn_rates(e, rates)
            return
        verdict = e.latency.observe(latency_s, lease.load)
        # Busy: at least half its share in flight, this call included. Only then does
        # an answer say something of the limit: one at normal latency that the endpoint
        # kept pace with that load (it may take more), a late one that the load queues
        # in the server. Late answers while far fewer calls are out than the limit
        # allows are not the limit's doing (cutting it then ratcheted it down, step
        # after step, until it bound the step).
        busy = e.in_flight * 2 >= e.share
        action = limits.respond(
            state,
            verdict,
            late_one=e.latency.late(latency_s),
            after_queue_cut=e.latency.after_queue_cut,
            drained=e.in_flight <= e.share,
        )
        if action == limits.QUEUE and verdict is not None:
            if busy:
                slots = verdict.slots
                log.info(
                    "judge endpoint %s queues calls: answers %.1fx its base of %.2f s with %.0f in flight;"
                    " about %.0f slots (limit was %.0f)",
                    e.url,
                    verdict.ratio,
                    e.latency.base or 0.0,
                    verdict.load,
                    slots,
                    state.limit,
                )
                self._change(lease, lambda s: limits.queued(s, lease.epoch, slots))
                e.latency.hold()
                e.latency.forget_recent()
                e.latency.after_queue_cut = True
        elif action == limits.REBASE:
            e.latency.rebase()
            log.info("judge endpoint %s is slower by itself: its base is now %.2f s", e.url, e.latency.base or 0.0)
        else:
            if verdict is not None:
                e.latency.after_queue_cut = False
            if action == limits.GROW and busy:
                e.grown += 1
                e.record = replace(e.record, limit=limits.grow(e.record.limit, 1))
        if rates is not None:
            self._learn_rates(e, rates)
        self._rate_floor(e, latency_s)

    def _rate_floor(self, e: Endpoint, latency_s: float) -> None:
        """A declared rate paces the calls: the limit need not hold them back below it."""
        record = e.record
        if record.rpm is None or record.rpm_inferred or record.limit.queues:
            return
        floor = limits.rate_floor(record.rpm, latency_s)
        if floor > record.limit.limit * 1.1:
            e.record = replace(record, limit=limits.at_least(record.limit, floor))
            self._background_update(e, lambda r: replace(r, limit=limits.at_least(r.limit, floor)))

    def rate_limited(self, lease: Lease, rates: RateHeaders) -> float:
        """A 429: the endpoint is alive but wants fewer calls. Without a rate in its
        headers, the rate it accepted just before becomes its pace (once per round), or
        failing that its concurrency is cut.

        Its retry-after is honoured: by the whole endpoint while no pace is known (it
        cools), else by the refused call alone; returns how long that call holds off
        the endpoint (0: it cooled, or another endpoint can take the call). Under a
        pace the 429 corrects the pace; cooling every call for a retry-after servers
        round up to whole seconds left the quota idle a second per 429."""
        e = lease.endpoint
        now = self._clock()
        self._count(e, "rate_limited")
        e.last_429 = now
        e.refused.append(lease.sent_at)
        if e.health.answered(self._clock()):
            self._notify(e, True)
        wait = rates.wait_s if rates.wait_s is not None else DEFAULT_COOL_S
        paced = e.record.rpm is not None
        if not paced:
            e.cool_until = max(e.cool_until, now + wait)
        self._learn_rates(e, rates, cool=not paced)
        hold_off = wait if paced and not any(o.health.up for o in self.endpoints if o is not e) else 0.0
        if e.record.rpm is not None and not e.record.rpm_inferred:
            return hold_off  # the endpoint declared its rate: pacing under it is the answer
        first = (
            e.inferred_at is None
            or not e.record.rpm_inferred
            or longest_pause(e.sent, e.inferred_at, now) > MAX_SEND_GAP_S
        )
        since = now - ACCEPTED_WINDOW_S if first or e.inferred_at is None else e.inferred_at
        own = inferred_rpm(e.sent, e.refused, since, now)
        rpm = None if own is None else fleet_rpm(own, e.fraction)
        if rpm is None:
            if first:
                self._cut(lease, limits.ERROR_CUT)
            elif (
                e.record.rpm is not None
                and e.inferred_at is not None
                and lease.sent_at > e.inferred_at
                and now - e.rate_cut_at >= RATE_CUT_SPACING_S
            ):
                # Refused at the pace just inferred, too soon to measure again: the
                # pace was too high; lower it at once (once per RATE_CUT_SPACING_S).
                e.rate_cut_at = now
                self._set_inferred(e, e.record.rpm * RATE_CUT)
            return hold_off
        e.inferred_at = now
        if first:
            if e.record.rpm is None or rpm < e.record.rpm:
                self._set_inferred(e, rpm)
        else:
            # Measured from the previous 429 to this one: the quota's bucket was empty at
            # both, so what it accepted in between is what it refilled, whatever was sent:
            # the pace follows it up as well as down (kept only ever lower, every 429
            # took the margin off again and the pace sank below the quota run after run).
            self._set_inferred(e, rpm)
        self._cut(lease, 1.0)  # slow start ends: the endpoint pushed back
        return hold_off

    def failed(self, lease: Lease, outcome: str, reason: str) -> None:
        """No answer: a connection refused or cut, a timeout, a 5xx.

        A timeout while the endpoint answers calls is a queue, not an outage: the
        call sat behind others in the server. It lowers the limit (:func:`limits.timed_out`)
        before its retry is placed, and does not count toward taking the endpoint out."""
        e = lease.endpoint
        self._count(e, outcome)
        now = self._clock()
        waited = now - lease.sent_at
        # Answering, or still working through the calls that timed out before (it
        # answers them to nobody): the call sat in its queue.
        if outcome == "timeout" and (
            e.health.answering_since(lease.sent_at - waited) or now <= e.unread_until + waited
        ):
            load, base = lease.load, e.latency.base or e.latency.fastest
            slots = e.record.limit.slots or e.limit
            e.unread_spacing = (base or waited) / max(slots, 1.0)
            e.unread_until = max(e.unread_until, now) + e.unread_spacing
            self._change(lease, lambda s: limits.timed_out(s, lease.epoch, load, base, waited))
            e.latency.hold()
            e.latency.forget_recent()
            return
        if e.health.failed(reason, now, probe=lease.probe, connection=outcome == "connection"):
            log.warning("judge endpoint %s out of the rotation: %s", e.url, reason)
            self._notify(e, False)
        elif e.health.check_wanted():
            self._check(e)
        if e.health.up:
            self._cut(lease, limits.ERROR_CUT)

    def _notify(self, e: Endpoint, up: bool) -> None:
        if up:
            log.warning("judge endpoint %s back in the rotation", e.url)
            before = e.answered_limit
            e.record = replace(e.record, limit=limits.relearned(e.record.limit, before))
            e.grown = 0.0
            # Its latency is learnt again too (it may be another server now): kept, the
            # answers slowed by the load before its outage sent every call to the others.
            e.latency = LatencyWatch()
            self._background_update(e, lambda r: replace(r, limit=limits.relearned(r.limit, before)))
        for listener in self.listeners:
            try:
                listener(e, up)
            except Exception:
                log.warning("a judge endpoint listener failed", exc_info=True)

    def _cut(self, lease: Lease, factor: float) -> None:
        self._change(lease, lambda s: limits.cut(s, lease.epoch, factor))

    def _change(self, lease: Lease, change: Callable[[limits.LimitState], limits.LimitState]) -> None:
        """Apply a cut to the limit here at once (the next placement sees it) and to the
        shared record; once per round (a call sent before the last cut changes nothing)."""
        e = lease.endpoint
        if e.record.limit.epoch > lease.epoch:
            return  # already cut since this call went out
        e.record = replace(e.record, limit=change(e.record.limit))
        e.grown = 0.0
        self._background_update(e, lambda r: replace(r, limit=change(r.limit)))

    def _learn_rates(self, e: Endpoint, rates: RateHeaders, *, cool: bool | None = None) -> None:
        """Take in the rates an answer states, and cool the endpoint for the wait it asks.

        ``cool`` None: only while no requests-per-minute pace holds after this answer.
        Calls paced exactly at a quota leave its window at 0 after nearly every call, so
        each answer said "exhausted, full again in a second": cooling on it sent the
        calls in bursts of a whole cooling's turns, beyond what the quota had refilled.
        """
        known = rates.limits
        if (known.rpm is not None and known.rpm != e.record.rpm) or (
            known.tpm is not None and known.tpm != e.record.tpm
        ):
            e.record = replace(
                e.record,
                rpm=known.rpm if known.rpm is not None else e.record.rpm,
                tpm=known.tpm or e.record.tpm,
                rpm_inferred=e.record.rpm_inferred and known.rpm is None,
            )
            declared = with_facts(rpm=known.rpm, tpm=known.tpm)
            self._background_update(
                e, lambda r: replace(declared(r), rpm_inferred=r.rpm_inferred and known.rpm is None)
            )
        if cool is None:
            cool = e.record.rpm is None
        if cool and rates.wait_s is not None and rates.wait_s > 0:
            e.cool_until = max(e.cool_until, self._clock() + rates.wait_s)

    def _set_inferred(self, e: Endpoint, rpm: float) -> None:
        e.record = replace(e.record, rpm=rpm, rpm_inferred=True)

        def change(record: EndpointRecord) -> EndpointRecord:
            if record.rpm is not None and not record.rpm_inferred:
                return record
            return replace(record, rpm=rpm, rpm_inferred=True)

        self._background_update(e, change)

    def learn(self, url: str, *, context_tokens: int | None = None, slots: int | None = None) -> None:
        """What an endpoint says of itself (its context window, its parallel slots)."""
        e = self.by_url[url]
        e.record = replace(
            e.record,
            context_tokens=context_tokens or e.record.context_tokens,
            slots=slots or e.record.slots,
        )
        e.record = replace(e.record, limit=limits.capped(e.record.limit, e.cap(e.record)))
        self._background_update(e, with_facts(context_tokens=context_tokens, slots=slots))

    def _background_update(self, e: Endpoint, change: Callable[[EndpointRecord], EndpointRecord]) -> None:
        async def run() -> None:
            try:
                record = await self.store.update(e.url, change)
            except Exception:
                log.warning("could not share what was learned of %s", e.url, exc_info=True)
                return
            self._adopt(e, record)
            self._dispatch()

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
