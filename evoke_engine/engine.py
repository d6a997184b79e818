"""The Engine: the model and its resources, settings, turns and the public API, behind one engine thread.

Invariants: every llama.cpp call runs on the engine thread (`EngineThread`); public methods are safe from
any thread and hand out snapshots and futures only; a turn's message is in SQLite before its reply starts,
its reply's row is written as it streams, and a failed turn rolls back (SQLite and the KV together).
Open conversations live in `lifecycle`, shared prefixes in `prefixes`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from . import editing, live_settings
from .attention import AttentionCapture, attach_capture
from .conversation import Conversation
from .embedder import Embedder
from .errors import BudgetError, EvokeError
from .events import EngineEvent, EventKind
from .exchange import parse_json, to_json, to_markdown
from .kv import KVCache
from .lifecycle import ConversationLifecycle, ConversationState
from .live_stats import StatsTicker
from .memory import min_budget_tokens
from .pool import SavedPool
from .prefixes import Prefix, SharedPrefixes, system_prompt_of, tools_of
from .recovery import backend as recovery_backend
from .reply_row import StreamedReply, reply_metrics
from .runtime import ModelInfo, Runtime
from .sampling import SamplingParams
from .scheduler import Sweeps
from .settings import Settings
from .slots import SlotRegistry
from .snapshot_fit import focus_from_history
from .store.history import DELETED, HistoryDB
from .store.kvfiles import KVFileStore, model_hash
from .store.owner import DataFolderLock
from .store.search import SearchHit
from .template import ChatTemplate
from .turn import Attachment, Reply, regenerate_reply, run_turn
from .worker import BACKGROUND, FOREGROUND, NORMAL, EngineThread

log = logging.getLogger(__name__)


@dataclass
class ConversationInfo:
    id: str
    title: str
    updated_at: float
    pinned: bool
    memory: str            # slot | ram | disk | none
    forked_from: str | None = None
    source: str = "app"    # app | api (made through the OpenAI-compatible endpoint)


class Engine:
    def __init__(self, settings: Settings | None = None, *, wait: bool = True, scheduler=None,
                 clock: Callable[[], float] = time.time, prewarm: bool = True) -> None:
        self.settings = dataclasses.replace(settings) if settings is not None else Settings()   # ours to mutate
        self.prewarm = prewarm
        self.clock = clock
        self.owner = DataFolderLock(self.settings.data_dir).acquire()   # first: a refused engine starts nothing
        self.thread = EngineThread()
        self._subscribers: list[Callable[[EngineEvent], None]] = []
        self.lifecycle = ConversationLifecycle(self)
        self._cancels: dict[str, set[threading.Event]] = {}     # one Event per queued or running turn
        self._cancels_lock = threading.Lock()
        self.focused: str | None = None
        self.last_activity = clock()
        try:
            self.history = HistoryDB(self.settings.data_dir / "history.sqlite3")
        except BaseException:
            self.thread.stop()
            self.owner.release()
            raise
        self.rt: Runtime | None = None
        self.attention: AttentionCapture | None = None
        self.kvfiles: KVFileStore | None = None
        self.ready: Future = self.thread.submit(self._load, self.settings, priority=FOREGROUND)
        self.sweeps = Sweeps(self, scheduler) if scheduler is not False else None
        if wait:
            try:
                self.ready.result()
            except BaseException:
                self.close()            # no scheduler, engine thread or database left behind by a failed load
                raise

    # -- events -----------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[EngineEvent], None]) -> None:
        self._subscribers.append(callback)

    def emit(self, event: EngineEvent) -> None:
        """Hand `event` to every subscriber (on the calling thread; a failing subscriber is logged)."""
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - an observer must not break the engine
                log.exception("event subscriber failed")

    # -- model ------------------------------------------------------------------------------
    def _load(self, settings: Settings) -> ModelInfo:
        self.emit(EngineEvent(EventKind.MODEL_LOADING, f"loading {settings.model_path or 'embedded model'}"))
        capture = AttentionCapture.create(gqa=settings.attention_gqa) if settings.attention_capture else None
        try:
            rt = Runtime(settings, eval_callback=capture)
        except EvokeError as exc:
            self.emit(EngineEvent(EventKind.LOAD_FAILED, str(exc)))
            raise
        self.rt = rt
        self.attention = attach_capture(capture, rt, settings, self.emit)
        self.kv = KVCache(rt, mirror=self.attention)
        self.template = ChatTemplate(rt.meta("tokenizer.chat_template"), bos_token=rt.token_text("bos"),
                                     eos_token=rt.token_text("eos"))
        self.pool = SavedPool(settings.ram_budget_bytes, settings.cache_dir / "spill",
                              spill_budget_bytes=settings.spill_budget_bytes,
                              reserve_bytes=settings.disk_reserve_bytes, bits=settings.pool_bits,
                              on_spill=lambda b: self.emit(EngineEvent(EventKind.SPILLED, f"{b.name} spilled to disk",
                                                                       block=b.name, tokens=b.n_tokens)))
        self.embedder = Embedder(settings.embedder)
        self.slots = SlotRegistry(settings.slots)
        self.prefixes = SharedPrefixes(rt, self.kv, self.template)
        ttls = live_settings.ttl_seconds(settings)
        self.kvfiles = KVFileStore(settings.cache_dir, model_hash(rt.model_path, settings.kv_cache_type, rt.n_ctx,
                                                                  settings.slots, rt.flash_attention),
                                   ttls, clock=self.clock)
        self.kvfiles.check(fix=True)
        if not rt.eviction_supported:
            self.emit(EngineEvent(EventKind.ERROR, f"{rt.eviction_note}; chat works without eviction"))
        shared = 0
        if self.prewarm:
            shared = len(self.warm_default_prefix().tokens)
            if self.embedder.enabled and recovery_backend(settings.recovery).evicts:
                self.thread.submit(self.embedder.warm, priority=BACKGROUND)
        if rt.n_contexts > 1:                       # each slot in its own context, with a copy of the prefix
            cells, room = settings.budget_tokens + 2 * settings.block_tokens, rt.n_ctx_per_context
        else:
            cells = shared + settings.slots * max(0, settings.budget_tokens - shared) + 2 * settings.block_tokens
            room = rt.n_ctx
        if recovery_backend(settings.recovery).evicts and cells > room:
            self.emit(EngineEvent(EventKind.ERROR, f"{settings.slots} slots of {settings.budget_tokens} tokens may "
                                  f"not fit in a context of {room}; raise n_ctx or lower slots or budget"))
        info = self._info = rt.info()
        self.emit(EngineEvent(EventKind.MODEL_LOADED, f"{info.name} on {info.device}"))
        return info

    def model_info(self) -> ModelInfo:
        self.ready.result()
        return self._info

    @property
    def loaded_model(self) -> ModelInfo:
        """The info of the model loaded now (engine thread: no wait on `ready`)."""
        return self._info

    @property
    def model_loaded(self) -> bool:
        return self.rt is not None

    def ensure_model(self) -> None:
        """Load the model back if the idle sweep unloaded it (engine thread). Every path that uses the model
        for the user comes through here, so here is where activity is stamped: a reload that did not stamp it
        would be unloaded again by the next idle check (issue 25). Sweeps never call this."""
        self.last_activity = self.clock()
        if self.rt is None:
            self._load(self.settings)
            self.last_activity = self.clock()          # a slow load is not idle time either

    def _unload(self, reason: str = "close") -> None:
        """Persist every open conversation, then free the model and its context (VRAM). `reason` (idle, reload,
        close) is in the event: only an idle unload says the model comes back on the next message."""
        if self.rt is None:
            return
        self.lifecycle.release_all()
        self.pool.close()
        self.prefixes.clear()
        self.rt.close()
        self.rt = None
        if self.attention is not None:                 # after the context that called into it
            self.attention.close()
            self.attention = None
        said = {"idle": "model unloaded after idle; it comes back on the next message",
                "reload": "model unloaded for the model change"}.get(reason, f"model unloaded ({reason})")
        self.emit(EngineEvent(EventKind.MODEL_UNLOADED, said, detail={"reason": reason}))

    def apply_settings(self, new: Settings) -> list[str]:
        """Adopt the settings that apply now (the budget reaches open conversations at once) and
        return the names that need `reload` to take effect."""
        new.validate()
        pending = new.needs_reload(self.settings)

        def apply() -> None:
            sizing = ("budget_tokens", "block_tokens", "tail_fraction", "recovery")
            resized = any(getattr(new, n) != getattr(self.settings, n) for n in sizing)
            if resized and recovery_backend(new.recovery).evicts and self.rt is not None:   # unloaded: at creation
                smallest = self._min_budget(new)
                if new.budget_tokens < smallest:
                    raise BudgetError(f"a budget of {new.budget_tokens} tokens leaves too little room after the "
                                      f"system prompt and tools for a reply: the smallest budget that works is "
                                      f"{smallest} tokens")
            old = dataclasses.replace(self.settings)
            for name in live_settings.now_fields():
                setattr(self.settings, name, getattr(new, name))
            open_states = self.lifecycle.open_states()
            live_settings.push(self, old, [state.memory for state in open_states])
            for state in open_states:
                self.lifecycle.refresh(state)

        self.thread.call(apply, priority=FOREGROUND)
        return pending

    def min_budget_tokens(self, settings: Settings | None = None) -> int:
        """The smallest `budget_tokens` that works under `settings` (default: the engine's) for a new
        conversation and every open one: a smaller budget is refused (`apply_settings`, `set_budget`, a new
        conversation). Loads the model if it was unloaded (ModelLoadError when it cannot)."""
        def run() -> int:
            self.ensure_model()
            return self._min_budget(settings or self.settings)
        return self.thread.call(run, priority=FOREGROUND)

    def _min_budget(self, settings: Settings) -> int:
        prefix = self.prefixes.for_conversation(system_prompt_of(settings), tools_of(settings))
        prefixes = [len(prefix.tokens), *(s.memory.prefix_tokens for s in self.lifecycle.open_states())]
        return max(min_budget_tokens(n, settings) for n in prefixes)

    def switch_embedder(self) -> None:
        """Vectors of the old embedder mean nothing to the new one: open conversations drop theirs (recomputed
        when a decision needs them) and get their task focus recomputed; saved files are adapted on open."""
        self.embedder = Embedder(self.settings.embedder)
        for state in self.lifecycle.open_states():
            focus = focus_from_history(self.history.messages(state.id), self.embedder, self.settings)
            state.memory.adopt_embedder(self.embedder, focus)
        if self.embedder.enabled and recovery_backend(self.settings.recovery).evicts:
            self.thread.submit(self.embedder.warm, priority=BACKGROUND)

    def settings_in_use(self, conversation_id: str) -> dict:
        """Each "applies now" setting as the object that uses it holds it (tests, diagnostics)."""
        return self.thread.call(lambda: live_settings.in_use(self, self.lifecycle.open(conversation_id).memory),
                                priority=FOREGROUND)

    def reload(self, new: Settings) -> Future:
        """Load the model `new` names; on failure the previous model is loaded back and the error raised."""
        new = dataclasses.replace(new)

        def swap() -> ModelInfo:
            old = self.settings
            self._unload("reload")
            try:
                self.settings = new
                return self._load(new)
            except EvokeError:
                self.settings = old
                if self.ready.exception() is None:         # the previous model had loaded: bring it back
                    self._load(old)
                raise

        future = self.thread.submit(swap, priority=FOREGROUND)
        future.add_done_callback(lambda f: None if f.exception() else setattr(self, "ready", f))
        return future

    def unload_model(self, reason: str = "idle") -> None:
        self.thread.call(lambda: self._unload(reason))

    def wait_idle(self) -> None:
        """Block until every job queued so far, background ones included, has run."""
        self.thread.call(lambda: None, priority=BACKGROUND + 1)

    def warm_default_prefix(self) -> Prefix:
        """The prefix a new conversation gets, decoded now if it was dropped (engine thread)."""
        return self.prefixes.for_conversation(system_prompt_of(self.settings), tools_of(self.settings))

    # -- conversations ----------------------------------------------------------------------
    def new_conversation(self, system_prompt: str | None = None, tools: list[dict] | None = None,
                         title: str | None = None, source: str | None = None) -> Conversation:
        self.ready.result()
        conversation_id = uuid.uuid4().hex
        system_prompt = system_prompt_of(self.settings) if system_prompt is None else system_prompt
        tools = tools_of(self.settings) if tools is None else tools
        state = self.thread.call(self.lifecycle.create, conversation_id, title or "New conversation",
                                 system_prompt, tools, source)
        return Conversation(self, state.id)

    def open_conversation(self, conversation_id: str) -> Conversation:
        self.thread.call(self.lifecycle.open, conversation_id, priority=FOREGROUND)
        return Conversation(self, conversation_id)

    def persist(self, conversation_id: str, ttl_class: str | None = None) -> bool:
        return self.thread.call(lambda: self.lifecycle.persist(self.lifecycle.open(conversation_id), ttl_class))

    def release_conversation(self, conversation_id: str, persist: bool = True) -> None:
        """Persist a conversation (unless told not to) and free its slot and RAM."""
        def release() -> None:
            state = self.lifecycle.get(conversation_id)
            if state is not None:
                self.lifecycle.release(state, persist=persist)
        self.thread.call(release)

    def conversations(self) -> list[ConversationInfo]:
        rows = self.history.list_conversations()
        out = []
        for row in rows:
            stats = self.lifecycle.latest_stats(row.id)
            memory = stats.memory if stats is not None else None
            if memory is None:
                memory = "disk" if self.kvfiles is not None and self.kvfiles.has(row.id) else "none"
            parent = row.settings.get("forked_from") if isinstance(row.settings, dict) else None
            source = row.settings.get("source", "app") if isinstance(row.settings, dict) else "app"
            out.append(ConversationInfo(row.id, row.title, row.updated_at, row.pinned, memory,
                                        forked_from=parent if isinstance(parent, str) else None, source=source))
        return out

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Live messages (text or attachment names) holding every word of `query`, best first, each with its
        conversation's title and a snippet marking the matches; safe for any input (no FTS5 syntax is parsed).
        Reads SQLite only: no engine thread, no model needed."""
        return self.history.search(query, limit)

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        def rename() -> None:
            self.history.rename(conversation_id, title)
            state = self.lifecycle.get(conversation_id)
            if state is not None:
                state.title = title
        self.thread.call(rename, priority=FOREGROUND)

    def pin_conversation(self, conversation_id: str, pinned: bool) -> None:
        def pin() -> None:
            self.history.set_pinned(conversation_id, pinned)
            state = self.lifecycle.get(conversation_id)
            if state is not None:
                state.pinned = pinned
        self.thread.call(pin, priority=FOREGROUND)

    def delete_conversation(self, conversation_id: str) -> None:
        self.thread.call(self.lifecycle.forget, conversation_id)
        self.history.delete(conversation_id)

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """The model's tokens for `text`, special tokens parsed unless `special` is False (a message's content:
        the engine never parses it); loads the model if it was unloaded."""
        def run() -> list[int]:
            self.ensure_model()
            return self.rt.tokenize(text, parse_special=special)
        return self.thread.call(run, priority=FOREGROUND)

    def focus(self, conversation_id: str | None) -> None:
        """Requests of the focused conversation are served before the others."""
        self.focused = conversation_id

    # -- turns ------------------------------------------------------------------------------
    def submit(self, conversation_id: str, text: str, attachments: Sequence[Attachment] = (), *,
               on_token: Callable[[str], None] | None = None, role: str = "user", extra: dict | None = None,
               **sampling) -> Future:
        """Start a turn; the Future gives the Reply. `on_token` runs on the engine thread. `role="tool"`
        with `extra={"tool_call_id": ...}` sends a tool result as the turn's input."""
        if role not in ("user", "tool"):
            raise ValueError(f"a turn's input is a user or tool message, not {role!r}")
        return self._submit_turn(conversation_id, self._turn, on_token, sampling, text, list(attachments),
                                 role=role, extra=extra)

    def _submit_turn(self, conversation_id: str, job: Callable, on_token: Callable[[str], None] | None,
                     sampling: dict, *args, **kwargs) -> Future:
        params = SamplingParams.from_settings(self.settings, **sampling)
        cancel = threading.Event()                   # this turn's own: a later submit never clears it
        with self._cancels_lock:
            self._cancels.setdefault(conversation_id, set()).add(cancel)
        priority = FOREGROUND if conversation_id == self.focused else NORMAL
        future = self.thread.submit(job, conversation_id, *args, params=params, on_token=on_token, cancel=cancel,
                                    priority=priority, **kwargs)
        future.add_done_callback(lambda _: self._turn_finished(conversation_id, cancel))
        return future

    def _turn_finished(self, conversation_id: str, cancel: threading.Event) -> None:
        with self._cancels_lock:
            events = self._cancels.get(conversation_id)
            if events is not None:
                events.discard(cancel)
                if not events:
                    del self._cancels[conversation_id]

    def cancel(self, conversation_id: str) -> None:
        """Stop the running and queued turns of a conversation (partial text is kept)."""
        with self._cancels_lock:
            events = list(self._cancels.get(conversation_id, ()))
        for event in events:
            event.set()

    def _turn(self, conversation_id: str, text: str, attachments: list[Attachment] | None, *,
              params: SamplingParams, on_token, cancel: threading.Event, role: str = "user",
              extra: dict | None = None, edit_index: int | None = None) -> Reply:
        """One turn; with `edit_index`, user message `edit_index` and all after it are replaced first.
        The reply's row is written while it streams (`reply_row`). Any failure but a cancel, saving the
        reply included, rolls the turn back: history, SQLite and KV as before it began."""
        self.last_activity = self.clock()
        self.lifecycle.take_rebuild(conversation_id)          # a rebuild at an earlier open is not this turn's
        state = self.lifecycle.open(conversation_id)
        self.lifecycle.ensure_slot(state)
        replaced, superseded = None, []
        if edit_index is not None:
            replaced, superseded = editing.rewind_for_edit(self, state, edit_index)
            state = self.lifecycle.get(conversation_id)
            if attachments is None:
                attachments = replaced.attachments
        attachments = list(attachments or [])
        n_before = len(state.history)
        user_row = self.history.add_message(state.id, role, text, attachments, extra=extra,
                                            previous_id=replaced.id if replaced else None)
        row = self._reply_row(state.id, on_token)

        def progress(done: int, total: int) -> None:
            if total > self.settings.block_tokens * 2:
                self.emit(EngineEvent(EventKind.PREFILL, f"{done}/{total}", conversation_id=state.id, tokens=done))

        try:
            reply = run_turn(state.memory, self.rt, self.template, state.history, text, attachments, params,
                             StatsTicker(self.lifecycle, state, row.on_token), cancel, progress,
                             system=state.system_message, role=role, extra=extra)
            self._count_rebuild(conversation_id, reply)
            row.finish(reply.text, reply_metrics(reply))
        except BaseException as exc:
            self._roll_back(state, n_before, [user_row, row.row_id], superseded, exc)
            raise
        finally:
            self.lifecycle.refresh(state)
            state.last_used = self.last_activity = self.clock()
        self.emit(EngineEvent(EventKind.TURN_DONE, f"{reply.n_tokens} tokens, stopped: {reply.stopped}",
                              conversation_id=state.id, tokens=reply.n_tokens))
        return reply

    def _reply_row(self, conversation_id: str, on_token, previous_id: int | None = None) -> StreamedReply:
        def failed(exc: Exception) -> None:
            self.emit(EngineEvent(EventKind.ERROR, f"the reply could not be saved while it streams ({exc}); "
                                  "it is saved when it ends", conversation_id=conversation_id))
        return StreamedReply(self.history, conversation_id, previous_id=previous_id, forward=on_token,
                             on_error=failed)

    def _count_rebuild(self, conversation_id: str, reply: Reply) -> None:
        """A KV rebuild this turn waited for is part of its reply's timing (its first token came after it)."""
        tokens, seconds = self.lifecycle.take_rebuild(conversation_id)
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
            self.lifecycle.discard(state, f"the failed turn could not be undone in the history: {exc}")
            self.emit(EngineEvent(EventKind.ERROR, f"the turn failed ({error}) and its rows could not be "
                                  f"removed ({exc}): the conversation is rebuilt from the history",
                                  conversation_id=state.id))
            return
        if superseded:
            self.lifecycle.discard(state, f"the edit failed: {error}")
            return
        try:
            editing.truncate_state(self, state, n_before)
        except Exception as exc:  # noqa: BLE001
            self.lifecycle.discard(state, f"the failed turn could not be undone: {exc}")
        self.emit(EngineEvent(EventKind.ERROR, f"the turn failed and was rolled back: {error}",
                              conversation_id=state.id))

    def _regenerate(self, conversation_id: str, *, params: SamplingParams, on_token,
                    cancel: threading.Event) -> Reply:
        self.last_activity = self.clock()
        self.lifecycle.take_rebuild(conversation_id)
        state = self.lifecycle.open(conversation_id)
        old = editing.rewind_for_regenerate(self, state)
        state = self.lifecycle.get(conversation_id)
        row = self._reply_row(state.id, on_token, previous_id=old.id)
        try:
            reply = regenerate_reply(state.memory, self.rt, self.template, state.history, params,
                                     StatsTicker(self.lifecycle, state, row.on_token), cancel,
                                     system=state.system_message)
            self._count_rebuild(conversation_id, reply)
            row.finish(reply.text, reply_metrics(reply))
        except BaseException as exc:
            try:
                self.history.hide_messages(state.id, [row.row_id] if row.row_id is not None else [], DELETED)
                self.history.restore_messages(state.id, [old.id])
            except Exception as undo:  # noqa: BLE001 - the KV is rebuilt from what SQLite kept
                log.warning("regenerate of %s could not be undone in the history: %s", state.id, undo)
            self.lifecycle.discard(state, f"the regenerate failed: {exc}")
            raise
        finally:
            self.lifecycle.refresh(state)
            state.last_used = self.last_activity = self.clock()
        self.emit(EngineEvent(EventKind.TURN_DONE, f"regenerated: {reply.n_tokens} tokens, stopped: {reply.stopped}",
                              conversation_id=state.id, tokens=reply.n_tokens))
        return reply

    # -- editing ----------------------------------------------------------------------------
    def regenerate(self, conversation_id: str, *, on_token: Callable[[str], None] | None = None,
                   **sampling) -> Future:
        """Drop the last reply (its cells and its live row) and sample a new one: no prefill."""
        return self._submit_turn(conversation_id, self._regenerate, on_token, sampling)

    def edit(self, conversation_id: str, message_index: int, new_text: str,
             attachments: Sequence[Attachment] | None = None, *, on_token: Callable[[str], None] | None = None,
             **sampling) -> Future:
        """Replace user message `message_index` (and drop all after it, KV rolled back) and send `new_text`;
        `attachments=None` keeps the message's own. The old rows stay as superseded versions."""
        return self._submit_turn(conversation_id, self._turn, on_token, sampling, new_text,
                                 None if attachments is None else list(attachments), edit_index=message_index)

    def truncate(self, conversation_id: str, n_messages: int) -> None:
        """Keep the first `n_messages` live messages; the rest leave the history and the KV."""
        self.thread.call(editing.truncate, self, conversation_id, n_messages, priority=FOREGROUND)

    def fork(self, conversation_id: str, message_index: int) -> Conversation:
        """A new conversation with the messages up to `message_index`, its KV cells shared with the parent."""
        child_id = self.thread.call(editing.fork, self, conversation_id, message_index, priority=FOREGROUND)
        return Conversation(self, child_id)

    def delete_message(self, conversation_id: str, message_index: int) -> None:
        """Remove one message from the conversation (kept as deleted until `compact_history`)."""
        self.thread.call(editing.delete_message, self, conversation_id, message_index, priority=FOREGROUND)

    def compact_history(self, conversation_id: str) -> int:
        """Erase the superseded and deleted rows kept for undo; returns how many went."""
        return self.history.compact(conversation_id)

    def export(self, conversation_id: str, format: str = "markdown") -> str:
        row = self.history.get_conversation(conversation_id)
        if row is None:
            raise KeyError(f"no conversation {conversation_id}")
        messages = self.history.messages(conversation_id)
        if format == "markdown":
            return to_markdown(row, messages)
        if format == "json":
            return to_json(row, messages)
        raise ValueError(f"unknown export format {format!r} (markdown or json)")

    def import_conversation(self, data: str | bytes | dict) -> Conversation:
        """A new conversation from `export(..., "json")`; its KV is built when it is first opened."""
        imported = parse_json(data)
        conversation_id = uuid.uuid4().hex
        with self.history.transaction():
            self.history.create_conversation(conversation_id, imported.title, imported.system_prompt,
                                             settings={"tools": imported.tools, "imported": True})
            for m in imported.messages:
                self.history.add_message(conversation_id, m.role, m.text, m.attachments, extra=m.extra)
        return Conversation(self, conversation_id)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True

        if self.sweeps is not None:
            self.sweeps.shutdown()
        try:
            self.thread.call(self._unload)
        finally:
            self.thread.stop()
            self.history.close()
            self.owner.release()                       # last: another engine may take the folder now

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
