"""What every app shares, and nothing domain-specific: API authentication, the error body,
the protocol's bounds, read-parameter helpers, the DB cursor, the Redis client, time
conversion and the request sanity middleware. It imports only `apps.clusters` (whose tokens
authenticate agents) and `apps.access` (whose roles scope a reader); the other apps
may import it (docs/architecture.md)."""
