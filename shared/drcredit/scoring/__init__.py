"""The scoring pipeline around the pure core: ingest, work units, dispatch, documents.

Every step reads and writes the database, so embedded mode (a thread pool in the API
process) and distributed mode (Celery workers) run the same functions and give the
same judgments and advantages.
"""
