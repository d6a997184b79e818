"""What the engine tells its observers: one immutable event per memory or model change, of a typed kind.

Invariants: events are plain frozen data, safe to hand across threads; `kind` is always an `EventKind`
(a str enum, so it compares equal to its value and prints as it).
"""

from __future__ import annotations

import enum
import time
from dataclasses import asdict, dataclass, field


class EventKind(enum.StrEnum):
    MODEL_LOADING = "model_loading"
    MODEL_LOADED = "model_loaded"
    MODEL_UNLOADED = "model_unloaded"
    LOAD_FAILED = "load_failed"
    EMBEDDER_WARMING = "embedder_warming"   # the embedder loads on its own thread; detail = {"first_use"}: it is
                                            # exported first (a minute, once); turns meanwhile recall by words
    EMBEDDER_READY = "embedder_ready"       # detail = {"seconds", "error"} (error None when it loaded)
    PREFILL = "prefill"                  # tokens of a long message decoded so far
    EVICTED = "evicted"
    RECOVERED = "recovered"
    SPILLED = "spilled"                  # saved bytes went from RAM to disk
    PARKED = "parked"                    # a conversation left its slot for another
    RELEASED = "released"                # an idle conversation was saved to disk and left memory
    KV_PERSISTED = "kv_persisted"
    KV_RESTORED = "kv_restored"
    KV_REBUILT = "kv_rebuilt"            # a cache was unusable or dropped: rebuilt from history
    KV_REBUILDING = "kv_rebuilding"      # a KV rebuild from history in progress: tokens = done so far,
                                         # detail = {"done", "total", "messages"} (done == total at the end)
    BLOCKS_REUSED = "blocks_reused"      # a message's blocks spliced from another conversation's K/V (chunk index):
                                         # detail = {"blocks": [{"block", "from", "where", "exact"}], "tokens"};
                                         # where: slot, ram, disk (the pool) or file (a closed conversation's KV file)
    KEPT = "kept"                        # an attached file kept in context until let go, or let go (the message says)
    TURN_DONE = "turn_done"
    ERROR = "error"


@dataclass(frozen=True)
class EngineEvent:
    kind: EventKind
    message: str
    conversation_id: str | None = None
    block: str | None = None
    tokens: int = 0
    time: float = field(default_factory=time.time)
    detail: dict | None = None        # e.g. the signal values that chose a recovered block

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))    # a wrong kind fails here, not in a subscriber

    def as_dict(self) -> dict:
        """Plain data, made once per event (it never changes; every stats snapshot lists the last 50 events): the
        same dict each call, which callers read and copy, never change."""
        made = self.__dict__.get("_plain")
        if made is None:
            made = {**asdict(self), "kind": self.kind.value}
            object.__setattr__(self, "_plain", made)
        return made
