"""DrCredit: rubric-grounded process credit for deep-research agents.

The package is the project's core library. ``drcredit.domain`` is the pure credit
math (no I/O); everything else (judges, storage, scoring pipeline, settings, client)
is the machinery the services in ``services/`` are thin shells around.
"""

__version__ = "0.1.0"
