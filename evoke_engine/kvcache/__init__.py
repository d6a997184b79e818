"""KV cache mechanism: blocks and the block table, a slot's resident sequence, the host pool, slots, shared
prefixes and the simulated cache. Imports only the runtime layer (plus store and the shared top-level leaves)."""
