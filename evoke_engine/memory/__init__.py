"""Memory policy: watermarks, scoring, eviction and recovery choice, retrieval signals, snapshots. Imports only
the KV mechanism and the runtime below it (plus store and the shared top-level leaves)."""
