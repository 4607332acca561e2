"""The work units: claimed under a lease, run on the engine, their judgments stored in order."""
