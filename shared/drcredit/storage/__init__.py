"""Persistence: SQLAlchemy 2 models, engine/session setup and Alembic migrations."""
