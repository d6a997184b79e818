"""The thread-safe handle on one conversation: turns, edits and read-only views of its memory.

Invariants: a handle holds only the engine and an id (any thread may use it) and calls only the Engine's public
methods, which hand out copies and summaries, never engine-thread state.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .conversations.turn import Attachment
from .stats import ConversationStats

if TYPE_CHECKING:
    from .engine import Engine


class Conversation:
    """A thread-safe handle on one conversation of an Engine."""

    def __init__(self, engine: Engine, conversation_id: str) -> None:
        self.engine = engine
        self.id = conversation_id

    @property
    def title(self) -> str:
        return self.engine.conversation_title(self.id)

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

    def continue_reply(self, **kwargs) -> Future:
        """Continue the last reply where it stopped (the same message grows); the Future gives the whole Reply."""
        return self.engine.continue_reply(self.id, **kwargs)

    def switch_version(self, message_id: int) -> int:
        """Make another version of a message current, with the messages that followed it (its branch)."""
        return self.engine.switch_version(self.id, message_id)

    def edit_reply(self, message_index: int, new_text: str) -> int:
        """Replace a reply's text (a new version of it; later messages move to the old version's branch)."""
        return self.engine.edit_reply(self.id, message_index, new_text)

    def fork(self, message_index: int) -> Conversation:
        return self.engine.fork(self.id, message_index)

    def truncate(self, n_messages: int) -> None:
        self.engine.truncate(self.id, n_messages)

    def delete_message(self, message_index: int) -> None:
        self.engine.delete_message(self.id, message_index)

    def undelete(self, message_ids: Sequence[int]) -> list[int]:
        """Undo a delete: the deleted rows come back and the KV is rebuilt from SQLite (conversations/versions.py)."""
        return self.engine.undelete(self.id, message_ids)

    def versions(self) -> dict[int, list[dict]]:
        """{live message id: its versions, oldest first} for messages that were regenerated or edited (read-only)."""
        return self.engine.versions(self.id)

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
        return self.engine.stats(self.id)

    def template_history(self) -> list[dict]:
        """A copy of the template messages (system excluded) the KV was built from (benches, tests)."""
        return self.engine.template_history(self.id)

    def blocks(self, *, with_text: bool = False) -> list[dict]:
        """One summary per block (as in `stats().blocks`), with each block's text when asked."""
        return self.engine.blocks(self.id, with_text=with_text)

    def vector_dims(self) -> tuple[set[int], int | None]:
        """Dimensions of the block embeddings (computed where missing) and of the task focus (diagnostics)."""
        return self.engine.vector_dims(self.id)

    def messages(self) -> list[dict]:
        """Live messages; "interrupted" marks a reply still streaming or cut short (the app was killed)."""
        return self.engine.messages(self.id)

    def keep_file(self, file_name: str, keep: bool = True) -> list[str]:
        """Keep an attached file in context until let go (`Engine.keep_file`); the blocks brought back."""
        return self.engine.keep_file(self.id, file_name, keep)

    def set_budget(self, tokens: int | None) -> None:
        """This conversation's own budget (None: the settings' budget again; `Engine.set_budget`)."""
        self.engine.set_budget(self.id, tokens)

    def reset_focus(self) -> None:
        """A task boundary: the task focus forgets the earlier messages (EVOKE's `task_boundary`)."""
        self.engine.reset_focus(self.id)

    def pin_block(self, name: str, pinned: bool = True, priority: float | None = None) -> None:
        """Pin a block (never evicted) or change its priority multiplier (the harness knows best)."""
        self.engine.pin_block(self.id, name, pinned, priority)

    def check(self) -> None:
        """Assert the block table mirrors llama.cpp's sequence (tests)."""
        self.engine.check(self.id)
