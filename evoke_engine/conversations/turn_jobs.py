"""A turn, a regenerate and a continued reply as jobs on the engine thread: the user's row, the streamed reply's
row, the KV, and the roll-back of all three when the turn fails.

Invariants: a turn's message is in SQLite before its reply starts and its reply's row is written as it streams
(`reply_row`); any failure but a cancel, saving the reply included, leaves history, SQLite and KV as before the
turn (or the KV dropped, to be rebuilt from what SQLite kept), but for a message its caller acknowledged as stored
(`on_stored`), which a failure never takes back; a continued reply grows its own row and a failed or
cancelled-before-sampling one leaves the row as it was. Works on the open conversations, never the Engine.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..errors import EditError
from ..events import EngineEvent, EventKind
from ..runtime.runtime import Cancelled
from ..runtime.sampling import SamplingParams
from ..store.history import DELETED
from . import editing, rerender
from .gloss_writer import GlossWriter, writes_glosses
from .lifecycle import ConversationLifecycle, ConversationState
from .live_stats import StatsTicker
from .reply_row import StreamedReply, reply_metrics
from .turn import (
    Attachment,
    Reply,
    continue_reply,
    input_message,
    prepare_ahead,
    regenerate_reply,
    resumable_reply,
    run_turn,
)

log = logging.getLogger(__name__)


class TurnJobs:
    """Runs turns on the open conversations; `on_activity(now)` hears when each one ends (the idle clock)."""

    def __init__(self, conversations: ConversationLifecycle, *, emit: Callable[[EngineEvent], None],
                 clock: Callable[[], float], on_activity: Callable[[float], None],
                 on_idle: Callable[[Callable[[], None]], None] = lambda work: work(),
                 glosses: GlossWriter | None = None) -> None:
        self.conversations, self.history = conversations, conversations.history
        self.emit, self.clock, self.on_activity = emit, clock, on_activity
        self.on_idle = on_idle              # runs work when the engine thread has nothing more urgent
        self.glosses = glosses              # the model's glosses of value lines, written on idle time (issue 61)

    def turn(self, conversation_id: str, text: str, attachments: list[Attachment] | None, *,
              params: SamplingParams, on_token, cancel: threading.Event, role: str = "user",
              extra: dict | None = None, edit_index: int | None = None,
              on_stored: Callable[[], None] | None = None) -> Reply:
        """One turn; with `edit_index`, user message `edit_index` and all after it are replaced first.
        The reply's row is written while it streams (`reply_row`). Any failure but a cancel, saving the
        reply included, rolls the turn back: history, SQLite and KV as before it began; except that with
        `on_stored` (called once the message is in SQLite: its caller acknowledges it, the endpoint's 200) a
        failure after it keeps the message (`_keep_message`)."""
        self.conversations.take_rebuild(conversation_id)          # a rebuild at an earlier open is not this turn's
        state = self.conversations.open(conversation_id)
        self.conversations.ensure_slot(state)
        model = self.conversations.model
        replaced, superseded = None, []
        if edit_index is not None:
            replaced, superseded = editing.rewind_for_edit(self.conversations, state, edit_index)
            state = self.conversations.get(conversation_id)
            if attachments is None:
                attachments = replaced.attachments
        attachments = list(attachments or [])
        # a template that rewrites earlier messages once this one arrives (Qwen3's dropped thinking): the KV follows
        # the whole render first (nothing for a stable template)
        rerender.settle(self.conversations, state, input_message(text, attachments, state.memory.turn + 1, role, extra))
        n_before = len(state.history)
        user_row = self.history.add_message(state.id, role, text, attachments, extra=extra,
                                            previous_id=replaced.id if replaced else None)
        row = self._reply_row(state.id, on_token)
        if on_stored is not None:
            on_stored()

        def progress(done: int, total: int) -> None:
            if total > model.settings.block_tokens * 2:
                self.emit(EngineEvent(EventKind.PREFILL, f"{done}/{total}", conversation_id=state.id, tokens=done))

        prepared, state.ahead = state.ahead, None
        try:
            reply = run_turn(state.memory, model.rt, model.template, state.history, text, attachments, params,
                             StatsTicker(self.conversations, state, row.on_token), cancel, progress,
                             system=state.system_message, role=role, extra=extra, prepared=prepared)
            self._count_rebuild(conversation_id, reply)
            row.finish(reply.text, reply_metrics(reply))
        except BaseException as exc:
            if on_stored is not None and not superseded:
                self._keep_message(state, row.row_id, exc)
            else:
                self._roll_back(state, n_before, [user_row, row.row_id], superseded, exc)
            raise
        finally:
            self._touched(state)
        self.emit(EngineEvent(EventKind.TURN_DONE, f"{reply.n_tokens} tokens, stopped: {reply.stopped}",
                              conversation_id=state.id, tokens=reply.n_tokens))
        return reply

    def prepare_ahead(self, conversation_id: str, text: str, attachments: list[Attachment], max_tokens: int) -> bool:
        """The user paused typing `text` into an open conversation: it takes its slot, and its next input and that
        input's recovery are worked out now (`turn.prepare_ahead`), kept for the turn that sends the same text
        after the same history. False, and nothing done, when the conversation is not open or no model is
        loaded: typing opens and loads nothing."""
        state = self.conversations.get(conversation_id)
        model = self.conversations.model
        if state is None or model is None or not text.strip():
            return False
        self.conversations.ensure_slot(state)
        state.ahead = prepare_ahead(state.memory, model.rt, model.template, state.history, text, attachments,
                                    max_tokens, system=state.system_message)
        self.conversations.refresh(state)             # the memory view shows what came back
        return True

    def _keep_message(self, state: ConversationState, reply_row: int | None, error: BaseException) -> None:
        """Undo a failed turn whose message was acknowledged as stored: the message stays, the reply's row (if it
        was written) leaves the live history, and the KV is dropped, to be rebuilt from what SQLite holds (a full
        disk may keep the row from being hidden too: the KV follows SQLite either way)."""
        try:
            if reply_row is not None:
                self.history.hide_messages(state.id, [reply_row], DELETED)
        except Exception as exc:  # noqa: BLE001 - the KV must follow whatever SQLite kept
            log.warning("the failed reply of %s could not be hidden: %s", state.id, exc)
        self.conversations.discard(state, f"the turn failed after its message was stored: {error}")
        self.emit(EngineEvent(EventKind.ERROR, f"the turn failed ({error}); its message is kept, its reply is not",
                              conversation_id=state.id))

    def _touched(self, state) -> None:
        """After any turn job, ended or failed: the stats snapshot refreshed, the conversation marked used now, its
        blocks' vectors queued for idle time."""
        self.conversations.refresh(state)
        state.last_used = self.clock()
        self.on_activity(state.last_used)
        self.on_idle(state.memory.embed_due)         # the turn's blocks' vectors, after the reply is answered
        model = self.conversations.model
        if self.glosses is not None and model is not None and writes_glosses(model.settings):
            self.on_idle(lambda: self.write_glosses(state.id))

    def write_glosses(self, conversation_id: str) -> None:
        """On idle time (after the turn's vectors): the model glosses the value lines of the conversation's blocks
        (`GlossWriter`, where `recall_glosses` has it write), stopping at once when other work arrives; queued again
        after that work, or while blocks are left past a run's quota (`GlossWriter.resume_after`)."""
        state = self.conversations.get(conversation_id)
        if state is not None and self.glosses is not None:
            cost = self.glosses.write(self.conversations.model, state.memory)
            if self.glosses.resume_after(cost):
                self.on_idle(lambda: self.write_glosses(conversation_id))

    def _reply_row(self, conversation_id: str, on_token, previous_id: int | None = None, *,
                   row_id: int | None = None, text: str = "") -> StreamedReply:
        def failed(exc: Exception) -> None:
            self.emit(EngineEvent(EventKind.ERROR, f"the reply could not be saved while it streams ({exc}); "
                                  "it is saved when it ends", conversation_id=conversation_id))
        return StreamedReply(self.history, conversation_id, previous_id=previous_id, forward=on_token,
                             on_error=failed, row_id=row_id, text=text)

    def _count_rebuild(self, conversation_id: str, reply: Reply) -> None:
        """A KV rebuild this turn waited for is part of its reply's timing (its first token came after it)."""
        tokens, seconds = self.conversations.take_rebuild(conversation_id)
        reply.rebuilt_tokens, reply.rebuild_s = tokens, seconds
        reply.ttft_s += seconds

    def _roll_back(self, state: ConversationState, n_before: int, rows: list[int | None], superseded: list,
                   error: BaseException) -> None:
        """Undo a failed turn: its rows (message, reply) leave the live history (kept as deleted), an edit's
        old messages come back, and the KV returns to where it was (or is rebuilt from SQLite). When SQLite
        cannot be changed either, the KV is dropped so that it is rebuilt from what SQLite holds."""
        try:
            self.history.hide_messages(state.id, [r for r in rows if r is not None], DELETED)
            if superseded:
                self.history.restore_messages(state.id, [r.id for r in superseded])
        except Exception as exc:  # noqa: BLE001 - the KV must follow whatever SQLite kept
            self.conversations.discard(state, f"the failed turn could not be undone in the history: {exc}")
            self.emit(EngineEvent(EventKind.ERROR, f"the turn failed ({error}) and its rows could not be "
                                  f"removed ({exc}): the conversation is rebuilt from the history",
                                  conversation_id=state.id))
            return
        if superseded:
            self.conversations.discard(state, f"the edit failed: {error}")
            return
        try:
            editing.truncate_state(self.conversations, state, n_before)
        except Exception as exc:  # noqa: BLE001
            self.conversations.discard(state, f"the failed turn could not be undone: {exc}")
        self.emit(EngineEvent(EventKind.ERROR, f"the turn failed and was rolled back: {error}",
                              conversation_id=state.id))

    def regenerate(self, conversation_id: str, *, params: SamplingParams, on_token,
                    cancel: threading.Event) -> Reply:
        self.conversations.take_rebuild(conversation_id)
        state = self.conversations.open(conversation_id)
        old = editing.rewind_for_regenerate(self.conversations, state)
        model = self.conversations.model
        state = self.conversations.get(conversation_id)
        row = self._reply_row(state.id, on_token, previous_id=old.id)
        try:
            reply = regenerate_reply(state.memory, model.rt, model.template, state.history, params,
                                     StatsTicker(self.conversations, state, row.on_token), cancel,
                                     system=state.system_message)
            self._count_rebuild(conversation_id, reply)
            row.finish(reply.text, reply_metrics(reply))
        except BaseException as exc:
            try:
                self.history.hide_messages(state.id, [row.row_id] if row.row_id is not None else [], DELETED)
                self.history.restore_messages(state.id, [old.id])
            except Exception as undo:  # noqa: BLE001 - the KV is rebuilt from what SQLite kept
                log.warning("regenerate of %s could not be undone in the history: %s", state.id, undo)
            self.conversations.discard(state, f"the regenerate failed: {exc}")
            raise
        finally:
            self._touched(state)
        self.emit(EngineEvent(EventKind.TURN_DONE, f"regenerated: {reply.n_tokens} tokens, stopped: {reply.stopped}",
                              conversation_id=state.id, tokens=reply.n_tokens))
        return reply


    def continue_reply(self, conversation_id: str, *, params: SamplingParams, on_token,
                       cancel: threading.Event) -> Reply:
        """Continue the last reply where it stopped (a stop, max tokens, a crash): the same row grows. EditError
        when the last message is not a reply."""
        self.conversations.take_rebuild(conversation_id)
        state = self.conversations.open(conversation_id)
        rows, state = editing.aligned_rows(self.conversations, state)
        if not rows or rows[-1].role != "assistant":
            raise EditError("there is no reply to continue: the last message is not the assistant's")
        old = rows[-1]
        model = self.conversations.model
        row = self._reply_row(state.id, on_token, row_id=old.id, text=old.text)
        try:
            resumed = resumable_reply(state.memory, model.rt, model.template, state.history,
                                      system=state.system_message) if state.history[-1]["content"] == old.text \
                else None
            if resumed is None:
                editing.truncate_state(self.conversations, state, len(rows) - 1)      # its blocks decode again
            else:
                state.history.pop()                         # its blocks stay: it grows where it stopped
            reply = continue_reply(state.memory, model.rt, model.template, state.history, old.text, params,
                                   StatsTicker(self.conversations, state, row.on_token), cancel,
                                   system=state.system_message, resumed=resumed)
            self._count_rebuild(conversation_id, reply)
            row.finish(reply.text, reply_metrics(reply))
        except BaseException as exc:
            try:
                self.history.update_message(state.id, old.id, old.text, extra=old.extra)
            except Exception as undo:  # noqa: BLE001 - the KV is rebuilt from what SQLite kept
                log.warning("continue of %s could not be undone in the history: %s", state.id, undo)
            self.conversations.discard(state, f"the continued reply failed: {exc}")
            if not isinstance(exc, Cancelled):
                raise
            reply = Reply(text=old.text, n_tokens=0, stopped="cancelled", ttft_s=0.0, decode_s=0.0,
                          prefill_tokens=0, recovered=[])
        finally:
            self._touched(state)
        self.emit(EngineEvent(EventKind.TURN_DONE, f"continued: {reply.n_tokens} tokens, stopped: {reply.stopped}",
                              conversation_id=state.id, tokens=reply.n_tokens))
        return reply
