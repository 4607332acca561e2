"""The ingest and results REST API (API.md), a thin shell over ``drcredit.scoring``."""
