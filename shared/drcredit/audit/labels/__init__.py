"""Labels from people: a person's value for a key the judge audit compares.

The keys and categories are the audit's (:mod:`.keys`); labels are stored per tenant,
one per labeler and key (:mod:`.store`); a labeler is offered a sample of the judge's
judgments with what the judge saw and never its answer (:mod:`.queue`); an audit with
``"judge": "human"`` pairs the original judgments with the labels, and the labelers with
each other (:mod:`.compare`, over the pure math of :mod:`drcredit.domain.agreement`).
"""
