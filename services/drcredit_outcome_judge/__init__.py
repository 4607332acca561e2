"""Outcome-judge service: judges reports (rubric satisfaction, citation support) from the ``outcome_judge`` queue."""
