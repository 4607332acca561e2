"""Real Postgres and Redis for the tests: throwaway databases on the local servers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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


#: Redis databases handed out by :func:`leased_redis_db` (0 holds the leases; 9 and 13
#: are named by tests of their own).
REDIS_DB_POOL = tuple(i for i in range(1, 16) if i not in (9, 13))
#: A lease lasts this long unless its holder gives it back (a holder killed outright).
REDIS_DB_LEASE_S = 6 * 3600


def _holder_alive(value: bytes | None) -> bool:
    """Whether the lease's holder (``host:pid:lease``) still runs (one on another host is assumed to)."""
    if value is None:
        return False
    host, pid, _ = value.decode().rsplit(":", 2)
    if host != os.uname().nodename:
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def _take_over(leases: Any, key: str, holder: str) -> bool:
    """Take a lease whose holder is gone, unless another process takes it first."""
    import redis

    with leases.pipeline() as pipe:
        try:
            pipe.watch(key)
            if _holder_alive(pipe.get(key)):
                return False
            pipe.multi()
            pipe.set(key, holder, ex=REDIS_DB_LEASE_S)
            pipe.execute()
        except redis.WatchError:
            return False
    return True


def lease_redis_db(base_url: str = REDIS_URL) -> tuple[str, str]:
    """A Redis database of the shared server no other process holds: (its URL, the lease key).

    Stacks that share a database index share their Celery queues: a worker of one then
    takes the other's messages, whose unit ids (from 1 in each database) name units of
    its own, and a ``flushdb`` of one drops the other's queue. A fixed or pid-derived index
    met another process's often enough on a machine running several suites at once.
    """
    import redis

    leases = redis.Redis.from_url(f"{base_url}/0")
    holder = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    for index in REDIS_DB_POOL:
        key = f"drcredit:redis-db-lease:{index}"
        if leases.set(key, holder, nx=True, ex=REDIS_DB_LEASE_S) or _take_over(leases, key, holder):
            url = f"{base_url}/{index}"
            redis.Redis.from_url(url).flushdb()
            return url, key
    raise RuntimeError(f"every Redis database of {base_url} ({list(REDIS_DB_POOL)}) is leased to a running process")


def release_redis_db(url: str, key: str) -> None:
    """Flush the leased database and give it back."""
    import redis

    redis.Redis.from_url(url).flushdb()
    redis.Redis.from_url(f"{url.rsplit('/', 1)[0]}/0").delete(key)


@contextmanager
def leased_redis_db(base_url: str = REDIS_URL) -> Iterator[str]:
    """:func:`lease_redis_db` for a block: a database flushed before and after, then given back."""
    url, key = lease_redis_db(base_url)
    try:
        yield url
    finally:
        release_redis_db(url, key)
