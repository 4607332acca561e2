"""Persistence: SQLAlchemy 2 models, engine and sessions, Alembic migrations, and the
hot-path statements (``repository``: group, unit and result rows; ``bulk``: multi-row
inserts and COPY). Imports only the domain; decisions stay with ``scoring``.
"""
