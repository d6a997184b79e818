"""The thread-safe handle on one conversation: turns, edits and read-only views of its memory.

Invariants: a handle holds only the engine and an id (any thread may use it); engine-thread state is
read or changed through `engine.thread` and `engine.lifecycle`, never handed out (copies and summaries only).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .stats import ConversationStats
from .turn import Attachment
from .versions import undelete, versions_of
from .worker import FOREGROUND

if TYPE_CHECKING:
    from .engine import Engine


class Conversation:
    """A thread-safe handle on one conversation of an Engine."""

    def __init__(self, engine: Engine, conversation_id: str) -> None:
        self.engine = engine
        self.id = conversation_id

    @property
    def title(self) -> str:
        row = self.engine.history.get_conversation(self.id)
        return row.title if row else ""

    def submit(self, text: str, attachments: Sequence[Attachment] = (), *,
               on_token: Callable[[str], None] | None = None, role: str = "user", extra: dict | None = None,
               **sampling) -> Future:
        """Start a turn; the Future gives the Reply. `on_token` runs on the engine thread. `role="tool"`
        with `extra={"tool_call_id": ...}` sends a tool result as the turn's input."""
        return self.engine.submit(self.id, text, attachments, on_token=on_token, role=role, extra=extra, **sampling)

    def regenerate(self, **kwargs) -> Future:
        return self.engine.regenerate(self.id, **kwargs)

    def edit(self, message_index: int, new_text: str, attachments: Sequence[Attachment] | None = None,
             **kwargs) -> Future:
        return self.engine.edit(self.id, message_index, new_text, attachments, **kwargs)

    def fork(self, message_index: int) -> Conversation:
        return self.engine.fork(self.id, message_index)

    def truncate(self, n_messages: int) -> None:
        self.engine.truncate(self.id, n_messages)

    def delete_message(self, message_index: int) -> None:
        self.engine.delete_message(self.id, message_index)

    def undelete(self, message_ids: Sequence[int]) -> list[int]:
        """Undo a delete: the deleted rows come back and the KV is rebuilt from SQLite (evoke_engine/versions.py)."""
        engine = self.engine
        return engine.thread.call(lambda: undelete(engine.history, engine.lifecycle, self.id, list(message_ids)),
                                  priority=FOREGROUND)

    def versions(self) -> dict[int, list[dict]]:
        """{live message id: its versions, oldest first} for messages that were regenerated or edited (read-only)."""
        return versions_of(self.engine.history, self.id)

    def export(self, format: str = "markdown") -> str:
        return self.engine.export(self.id, format)

    def send(self, text: str, attachments: Sequence[Attachment] = (), **sampling) -> str:
        return self.submit(text, attachments, **sampling).result().text

    def stream(self, text: str, attachments: Sequence[Attachment] = (), **sampling) -> Iterator[str]:
        pieces: queue.Queue = queue.Queue()
        done = object()
        future = self.submit(text, attachments, on_token=pieces.put, **sampling)
        future.add_done_callback(lambda _: pieces.put(done))
        try:
            while (piece := pieces.get()) is not done:
                yield piece
            future.result()
        finally:
            if not future.done():
                self.cancel()

    def cancel(self) -> None:
        """Stop the running and queued replies of this conversation (their partial text is kept)."""
        self.engine.cancel(self.id)

    def stats(self) -> ConversationStats:
        """The latest memory snapshot (zeros before the conversation is first opened); never waits."""
        return self.engine.lifecycle.latest_stats(self.id) or ConversationStats(self.id)

    def template_history(self) -> list[dict]:
        """A copy of the template messages (system excluded) the KV was built from (benches, tests)."""
        return self.engine.thread.call(lambda: [dict(m) for m in self.engine.lifecycle.open(self.id).history])

    def blocks(self, *, with_text: bool = False) -> list[dict]:
        """One summary per block (as in `stats().blocks`), with each block's text when asked."""
        def read() -> list[dict]:
            table = self.engine.lifecycle.open(self.id).memory.table
            return [{**b.summary(), **({"text": b.text} if with_text else {})} for b in table.blocks]
        return self.engine.thread.call(read)

    def vector_dims(self) -> tuple[set[int], int | None]:
        """Dimensions of the block embeddings (computed where missing) and of the task focus (diagnostics)."""
        def read() -> tuple[set[int], int | None]:
            memory = self.engine.lifecycle.open(self.id).memory
            memory.ensure_embeddings(memory.table.blocks)
            dims = {b.embedding.shape[0] for b in memory.table.blocks if b.embedding is not None}
            return dims, None if memory.focus.vector is None else memory.focus.vector.shape[0]
        return self.engine.thread.call(read)

    def messages(self) -> list[dict]:
        """Live messages; "interrupted" marks a reply still streaming or cut short (the app was killed)."""
        return [{"role": m.role, "text": m.text, "attachments": m.attachments, "created_at": m.created_at,
                 "id": m.id, "extra": m.extra, "interrupted": m.interrupted}
                for m in self.engine.history.messages(self.id)]

    def set_budget(self, tokens: int) -> None:
        def apply() -> None:
            state = self.engine.lifecycle.open(self.id)
            state.memory.set_budget(tokens)
            self.engine.lifecycle.refresh(state)

        self.engine.thread.call(apply, priority=FOREGROUND)

    def reset_focus(self) -> None:
        """A task boundary: the task focus forgets the earlier messages (EVOKE's `task_boundary`)."""
        def apply() -> None:
            self.engine.lifecycle.open(self.id).memory.focus.vector = None

        self.engine.thread.call(apply, priority=FOREGROUND)

    def pin_block(self, name: str, pinned: bool = True, priority: float | None = None) -> None:
        """Pin a block (never evicted) or change its priority multiplier (the harness knows best)."""
        def apply() -> None:
            state = self.engine.lifecycle.open(self.id)
            state.memory.table.pin(name, pinned, priority)
            self.engine.lifecycle.refresh(state)

        self.engine.thread.call(apply, priority=FOREGROUND)

    def check(self) -> None:
        """Assert the block table mirrors llama.cpp's sequence (tests)."""
        self.engine.thread.call(lambda: self.engine.lifecycle.open(self.id).memory.check())
