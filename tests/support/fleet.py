"""Driving a judge fleet's rules from a test without a server."""

from __future__ import annotations

from drcredit.judges.fleet.health import FAILURES_TO_OPEN
from drcredit.judges.fleet.router import Fleet


def start_a_health_check(fleet: Fleet, reason: str = "Can not write request body") -> None:
    """Connection failures in a row on the fleet's endpoint: the fleet starts a health
    check in the background (it runs once the caller yields to the loop)."""
    for _ in range(FAILURES_TO_OPEN):
        lease = fleet._place(frozenset(), False)
        assert lease is not None
        fleet.failed(lease, "connection", reason)
        fleet.release(lease)
