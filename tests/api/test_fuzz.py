"""Generated requests from the served OpenAPI document never answer 5xx (schemathesis).

Every operation gets a bounded number of generated cases (valid and invalid bodies, path
ids and query values), sent over HTTP to the real service on SQLite and on Postgres.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from drcredit_api.app import create_app
from tests.support.api import settings_for
from tests.support.live import serving

EXAMPLES = 25


@pytest.fixture
def service(database_url: str, tmp_path: Path) -> Iterator[str]:
    # Long-polls of generated waits end within a second (a generated streaming group
    # may never finish).
    with serving(create_app(settings_for(database_url, None, max_wait_s=1))) as url:
        yield url


def test_no_generated_request_answers_5xx(service: str) -> None:
    schema = schemathesis.openapi.from_url(f"{service}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    seen: dict[str, set[int]] = {}

    def fuzz(operation: Any) -> None:
        name = f"{operation.method.upper()} {operation.path}"

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def call(case: schemathesis.Case) -> None:
            response = case.call(base_url=service, timeout=30)
            seen.setdefault(name, set()).add(response.status_code)
            assert response.status_code < 500, f"{name}: {response.status_code} {response.text[:500]}"

        call()

    for operation in operations:
        fuzz(operation)
    assert set(seen) == {f"{o.method.upper()} {o.path}" for o in operations}
