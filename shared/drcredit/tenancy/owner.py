"""Whose a judge call is: the tenant, its training run, and whether it is an audit's.

Set by whoever starts the work (a unit of a group, an audit) on its task, like the call's
priority, and read by the judge fleet when the call waits for a place and by the metrics
when it is answered.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    """The tenant, run ("" when the group names none) and class of a judge call."""

    tenant: str = ""
    run: str = ""
    audit: bool = False


#: The owner of the judge calls made by the current task.
CALL_OWNER: ContextVar[Owner] = ContextVar("drcredit_call_owner", default=Owner())  # noqa: B039 - frozen, never mutated
