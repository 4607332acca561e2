"""Visit-judge service: runs (rollout, rubric) visit chains from the ``visit_judge`` queue."""
