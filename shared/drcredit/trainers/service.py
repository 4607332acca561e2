"""Talking to the service from inside a training step: one client, one deadline, no silent zeros.

A training step that posts its groups must either get their advantages or stop. When the
service cannot be reached (connections refused, 5xx after the SDK's own retries) the step
logs what it is waiting for and retries, up to ``unreachable_timeout_s`` of continuous
outage and never past the step's ``timeout_s``; then it raises
:class:`DrCreditUnavailable`. No adapter ever fills in zeros for advantages it did not get.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from drcredit.client import DrCreditClient
from drcredit.client.errors import DrCreditConnectionError, NotFound, ServerError
from drcredit.trainers.settings import DrCreditSettings

log = logging.getLogger("drcredit.trainers")

T = TypeVar("T")

#: Pause between attempts while the service is unreachable (the SDK already retried each call).
RETRY_EVERY_S = 5.0
UNREACHABLE: tuple[type[BaseException], ...] = (DrCreditConnectionError, ServerError)


class DrCreditUnavailable(DrCreditConnectionError):
    """The service stayed unreachable longer than the step allows; the step stops without training."""


def make_client(settings: DrCreditSettings) -> Any:
    return DrCreditClient(settings.base_url, api_key=settings.api_key)


@dataclass
class StepDeadline:
    """The time a step has left, and how it rides out an outage of the service."""

    timeout_s: float
    unreachable_timeout_s: float
    #: what is waiting, for the messages ("training step 12")
    label: str
    base_url: str
    #: pause between attempts while unreachable (default :data:`RETRY_EVERY_S`)
    retry_every_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    down_since: float | None = None

    @classmethod
    def for_step(cls, settings: DrCreditSettings, client: Any, label: str) -> StepDeadline:
        return cls(settings.timeout_s, settings.unreachable_timeout_s, label, str(getattr(client, "base_url", "?")))

    def remaining(self) -> float:
        return max(0.0, self.started + self.timeout_s - time.monotonic())

    def call(self, action: Callable[[], T], doing: str) -> T:
        """``action()``; while the service cannot be reached, wait and try again, then give up."""
        while True:
            try:
                result = action()
            except UNREACHABLE as exc:
                now = time.monotonic()
                if self.down_since is None:
                    self.down_since = now
                down_for = now - self.down_since
                left = min(self.unreachable_timeout_s - down_for, self.remaining())
                if left <= 0:
                    raise DrCreditUnavailable(
                        f"DrCredit at {self.base_url} could not be reached for {down_for:.0f}s while {doing} "
                        f"({self.label}): {exc}. The step stops instead of training without advantages; "
                        "set unreachable_timeout_s (DRCREDIT_UNREACHABLE_TIMEOUT_S) to wait longer"
                    ) from exc
                pause = min(self.retry_every_s or RETRY_EVERY_S, left)
                log.warning(
                    "DrCredit at %s cannot be reached while %s (%s): %s. Waiting %.0fs and trying again; "
                    "the step gives up in %.0fs (unreachable_timeout_s / DRCREDIT_UNREACHABLE_TIMEOUT_S)",
                    self.base_url,
                    doing,
                    self.label,
                    exc,
                    pause,
                    left,
                )
                time.sleep(pause)
                continue
            if self.down_since is not None:
                log.warning(
                    "DrCredit at %s answers again after %.0fs (%s)",
                    self.base_url,
                    time.monotonic() - self.down_since,
                    self.label,
                )
                self.down_since = None
            return result


def post_and_wait(
    client: Any,
    groups: Sequence[Mapping[str, Any]],
    batch_id: str,
    deadline: StepDeadline,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Post a step's groups as one batch and wait for their advantages, riding out outages.

    A service that lost the batch while it was down (``404`` once it answers again) is sent
    the batch again; ids are content-addressed, so nothing is judged twice.
    """

    def submit() -> Any:
        return client.submit_batch(groups, batch_id=batch_id)

    answer = deadline.call(submit, f"posting batch {batch_id}")
    if isinstance(answer, Mapping) and answer.get("batch_id"):
        batch_id = str(answer["batch_id"])
    log.info(
        "DrCredit: %s posted batch %s (%d groups); waiting up to %.0fs",
        deadline.label,
        batch_id,
        len(groups),
        deadline.remaining(),
    )
    posted_again = False
    while True:
        try:
            document: dict[str, Any] = deadline.call(
                lambda: client.wait_for_batch(batch_id, timeout=deadline.remaining(), progress=progress),
                f"waiting for batch {batch_id}",
            )
            return document
        except NotFound:
            if posted_again:
                raise
            log.warning("DrCredit at %s no longer knows batch %s: posting it again", deadline.base_url, batch_id)
            deadline.call(submit, f"posting batch {batch_id} again")
            posted_again = True
