"""The real DrCredit service (embedded SQLite, offline judge) for the adapter tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from drcredit_api.app import create_app
from tests.support.api import settings_for
from tests.support.live import serving


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app on a free port; yields its base URL."""
    database = tmp_path_factory.mktemp("drcredit") / "drcredit.sqlite3"
    with serving(create_app(settings_for(f"sqlite:///{database}", None))) as url:
        yield url
