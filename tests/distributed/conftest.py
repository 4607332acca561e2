"""Fixtures of the distributed tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from drcredit.storage.migrate import upgrade
from tests.support.infra import postgres_database


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh Postgres database at the schema's head."""
    with postgres_database("drcredit_dist") as url:
        upgrade(url)
        yield url
