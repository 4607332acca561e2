"""Distributed execution: the Celery application, queue names and the dispatcher.

The API only *sends* tasks by name (it imports no worker code); the service packages
``drcredit_visit_judge``, ``drcredit_snippet_matcher`` and ``drcredit_aggregator``
define them and run them in ``drcredit worker`` processes.
"""
