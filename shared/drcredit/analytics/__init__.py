"""Views over scored groups for people, not trainers: the evidence proxy of a group
(docs/method.md, "Evidence proxy"), a training run's per-step series, and a batch's pooled
sensitivity replay (docs/method.md, "Sensitivity replay"). Everything is read from stored
results and judgments; no judge is called. The math stays in the pure core (``domain.evidence``, ``domain.sensitivity``,
``domain.summaries``); these modules only read rows and shape documents.
"""
