"""Real Postgres and Redis for the tests: throwaway databases on the local servers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

PG_ADMIN = os.environ.get("DRCREDIT_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("DRCREDIT_TEST_REDIS", "redis://127.0.0.1:6379")


def sqlalchemy_url(dbname: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{dbname}"


@contextmanager
def postgres_database(prefix: str = "drcredit_test") -> Iterator[str]:
    """Create an empty database, yield its SQLAlchemy URL, drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield sqlalchemy_url(name)
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
