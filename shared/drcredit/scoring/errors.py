"""Errors the API and CLI translate into answers (404, 409, 422)."""

from __future__ import annotations


class NotFound(LookupError):
    """No such group or batch for this tenant."""


class Conflict(Exception):
    """The id exists with other content, or the request does not fit the group's state."""


class NotReady(Exception):
    """The group is not done; carries its status for a 409 answer."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
