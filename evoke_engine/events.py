"""What the engine tells its observers: one immutable event per memory or model change.

Invariant: events are plain data, safe to hand across threads.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class EngineEvent:
    kind: str
    message: str
    conversation_id: str | None = None
    block: str | None = None
    tokens: int = 0
    time: float = field(default_factory=time.time)
    detail: dict | None = None        # e.g. the signal values that chose a recovered block

    def as_dict(self) -> dict:
        return asdict(self)
