"""Reads for the dashboard pages, by what they read: time ranges (`ranges`), tile health
(`health`), alert lists (`alerts`), a run's steps, checksums and checkpoints (`runs`), a
node's events and the ranks on it (`nodes`).

Every function here runs a fixed number of queries whatever the number of nodes or ranks."""
