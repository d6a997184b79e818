"""`bench day --glosses`: the loaded model's glosses of value lines (issue 61) carried into the day's replay, written
by the real model after each turn as the engine's idle-time writer would (`GlossWriter`, nothing else waiting), or
read from a book an earlier run wrote; the decisions then read them (`recall_glosses` on).

Invariants: the replay is `bench day`'s own; only `glosses.BOOK` and the setting differ; the model writes with the
writer's prompt, per-block cap and filter; what writing cost (blocks, lines, tokens, seconds under this machine's
load) comes back with the figures; a book is JSON: block hash -> [[line, gloss]], as a KV file keeps them.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from evoke_engine.conversations.gloss_writer import GlossCost, GlossWriter
from evoke_engine.conversations.loaded_model import LoadedModel
from evoke_engine.memory.glosses import BOOK
from evoke_engine.settings import Settings
from evoke_engine.settings_hub import SettingsHub

from .retrieval_sim import SimConversation


def parse(spec: str) -> tuple[str, Path]:
    """`write:PATH` or `read:PATH`; anything else is a clear error."""
    mode, _, path = spec.partition(":")
    if mode not in ("write", "read") or not path:
        raise SystemExit(f"--glosses {spec!r}: write it as write:PATH (the model writes them) or read:PATH")
    return mode, Path(path)


def read_book(path: Path) -> int:
    """Seed `BOOK` from a book file; the blocks added."""
    return BOOK.seed(json.loads(path.read_text()))


def save_book(path: Path) -> None:
    path.write_text(json.dumps(BOOK.export(BOOK.hashes()), indent=0))


class TurnGlosser:
    """After each replayed turn, the real model glosses up to `blocks_per_run` of the conversation's blocks."""

    def __init__(self, model_path: str | None = None, blocks_per_run: int = 8) -> None:
        settings = Settings(home=tempfile.mkdtemp(prefix="evoke-glosses-"), model_path=model_path, embedder="off",
                            recall_glosses="on", n_ctx=2048, slots=1, budget_tokens=1024)
        self.model = LoadedModel.load(SettingsHub(settings), emit=lambda event: None, clock=time.monotonic)
        self.writer = GlossWriter(lambda: False, blocks_per_run=blocks_per_run)

    def __call__(self, conv: SimConversation) -> None:
        self.writer.write(self.model, conv.memory)

    @property
    def cost(self) -> GlossCost:
        return self.writer.total

    def close(self) -> None:
        self.model.close()
