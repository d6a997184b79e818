"""Persistence: SQLite chat history (the source of truth) and TTL-tagged KV cache files (a rebuildable cache).

Invariant: environment failures (disk full, locked, read-only, damaged files) surface as `StoreError`.
"""

from evoke_engine.store.history import ConversationRow, HistoryDB, MessageRow
from evoke_engine.store.kvfiles import KVFileStore, model_hash
from evoke_engine.store.kvnames import DEFAULT_TTL_SECONDS, TTL_CLASSES, parse_ttl_class
from evoke_engine.store.store_error import StoreError

__all__ = [
    "DEFAULT_TTL_SECONDS",
    "TTL_CLASSES",
    "ConversationRow",
    "HistoryDB",
    "KVFileStore",
    "MessageRow",
    "StoreError",
    "model_hash",
    "parse_ttl_class",
]
