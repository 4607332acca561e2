"""Judge audits: a second judge re-scores a sample of done groups, and the two are compared.

The operator names the audit judges (``DRCREDIT_AUDIT_JUDGES``, :mod:`.judges`); a
tenant starts an audit over a run, a batch or a list of groups (:mod:`.service`); the
sampled groups are re-scored by the audit judge with the same content and parameters and
its own support histories (:mod:`.rescore`), below every training call, and kept apart;
the report pairs the two judges' judgments and measures how far the training signal
moves (:mod:`.report`, over the pure math of :mod:`drcredit.domain.agreement`).
"""
