"""The ingest and results REST API (docs/api.md), a thin shell over ``drcredit.scoring``."""
