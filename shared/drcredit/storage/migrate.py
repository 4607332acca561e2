"""Run Alembic migrations programmatically (``drcredit db upgrade`` and start-up).

The API and the workers bring the schema to head when they start (unless
``DRCREDIT_AUTO_MIGRATE=false``). Several replicas starting at once are serialized by a
Postgres advisory lock held for the migration's transaction: the first migrates, the
others find the schema at head and do nothing.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, make_url, pool

MIGRATIONS = Path(__file__).parent / "migrations"

#: Key of the advisory lock that serializes migrations across processes ("drcredit").
MIGRATION_LOCK_KEY = 0x6472637265646974


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to ``revision``; on Postgres one process at a time."""
    config = alembic_config(url)
    if not url.startswith("postgresql"):
        database = make_url(url).database
        if url.startswith("sqlite") and database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no data directory
        command.upgrade(config, revision)
        return
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            # Held until this transaction ends: the migration's own (env.py joins it).
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            conn.commit()
    finally:
        engine.dispose()


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def schema_problem(engine: Engine) -> str | None:
    """None when the schema is at head; otherwise one line saying what to do."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return None
    at = f"at revision {current}" if current else "empty (no tables)"
    return (
        f"the database schema is {at} and this release needs revision {head}: run `drcredit db upgrade` "
        "(or start without DRCREDIT_AUTO_MIGRATE=false to migrate at start-up)"
    )
