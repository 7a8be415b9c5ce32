"""The worker's service, run in-process on real Postgres: what a batch becomes."""
