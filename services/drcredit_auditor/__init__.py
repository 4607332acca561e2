"""Auditor service: re-scores sampled groups with an audit judge and compares (docs/audit.md)."""
