"""The ``drcredit`` command: score, serve, worker, db."""
