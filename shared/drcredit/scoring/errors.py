"""Errors the API and CLI translate into answers (404, 409, 422, 503)."""

from __future__ import annotations


class NotFound(LookupError):
    """No such group or batch for this tenant; ``field`` names the id that was looked up."""

    def __init__(self, message: str, field: str = "group_id"):
        super().__init__(message)
        self.field = field


class Conflict(Exception):
    """The id exists with other content, or the request does not fit the group's state.

    ``differences`` lists (field, what differs) where a re-post differs from what is stored.
    """

    def __init__(self, message: str, differences: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.differences = differences or []


class NotReady(Exception):
    """The group is not done; carries its status for a 409 answer."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class Unavailable(Exception):
    """The service cannot answer now (database away, schema behind); a 503 with Retry-After."""

    def __init__(self, message: str, retry_after_s: int = 5):
        super().__init__(message)
        self.retry_after_s = retry_after_s
