"""The scoring pipeline around the pure core, one module per step of a unit's life.

A group is stored by ``ingest`` and planned into work units by ``planning``; ``lifecycle``
claims each unit under a lease and runs its kind (``visit_chain``, ``snippet_unit``,
``outcome_unit``, listed in ``unit_kinds``), which asks the judge through ``judging`` and
stores every answer through the batch writer of ``writes`` (where ``snippet_release``
decides waiting snippet calls and the last unit flips the group to aggregation);
``aggregation`` computes credits and advantages once, ``documents`` and ``replay`` read
them back, and ``recovery`` finds work a lost worker or message left behind. Every step
reads and writes the database, so embedded mode (the API process) and distributed mode
(Celery workers) run the same code and give the same judgments and advantages.
``pipeline`` is the facade that wires the parts. See docs/architecture.md.
"""
