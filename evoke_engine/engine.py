"""The Engine: the public API behind one engine thread; it loads and unloads the model and wires the collaborators.

Invariants: every llama.cpp call runs on the engine thread (`EngineThread`); public methods are safe from
any thread and hand out snapshots and futures only; `model` is a `LoadedModel` exactly while the model is loaded
(closed in one place, `_unload`); open conversations live in `lifecycle`, turns run in `turns` (`TurnJobs`),
the sweeps see the engine as a `SweepHost`; nothing below this module refers to the Engine. `settings` is the
`settings_hub`'s frozen current value, swapped on the engine thread, whose consumers subscribe to the fields they
use; `focused` and `last_activity` are written on the engine thread only (other threads may read them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .conversation import Conversation
from .conversations import branches, editing
from .conversations.completion import Completion, complete
from .conversations.exchange import parse_conversation, store_imported, to_json, to_markdown, write_all
from .conversations.gloss_writer import GlossWriter
from .conversations.history_view import ConversationInfo
from .conversations.lifecycle import ConversationLifecycle, ConversationState
from .conversations.loaded_model import LoadedModel, follow_ttl_settings
from .conversations.snapshot_fit import focus_from_history
from .conversations.turn import Attachment
from .conversations.turn_jobs import TurnJobs
from .conversations.versions import undelete, versions_of
from .errors import EvokeError
from .events import EngineEvent, EventKind
from .kvcache.prefixes import Prefix, system_prompt_of, tools_of
from .memory.embedder import Embedder
from .memory.memory import min_budget_tokens, require_budget
from .memory.recovery import backend as recovery_backend
from .runtime.backend import LLAMA_CPP, Backend
from .runtime.runtime import ModelInfo
from .runtime.sampling import SamplingParams
from .settings import Settings
from .settings_hub import SettingsHub
from .stats import ConversationStats
from .store.history import HistoryDB
from .store.kvfiles import KVFileStore
from .store.owner import DataFolderLock
from .store.search import SearchHit
from .sweeps import Sweeps
from .worker import BACKGROUND, FOREGROUND, LATENCY, NORMAL, Command, EngineThread, Job

log = logging.getLogger(__name__)
# How long closing waits for the embedder's background load to end (ONNX Runtime builds its session in about a
# second here; a first use that exports the model takes longer, and a process that ends during it still aborts)
EMBEDDER_LOAD_WAIT_S = 15.0


class Engine:
    def __init__(self, settings: Settings | None = None, *, wait: bool = True, scheduler=None,
                 clock: Callable[[], float] = time.time, prewarm: bool = True, backend: Backend = LLAMA_CPP) -> None:
        self.settings_hub = SettingsHub(settings if settings is not None else Settings())
        self.prewarm = prewarm
        self.backend = backend                       # what each load builds the model on (llama.cpp)
        self.clock = clock
        self._closed = False
        self.owner = DataFolderLock(self.settings.data_dir).acquire()   # first: a refused engine starts nothing
        self.thread = EngineThread(stream_limit=self._stream_limit)
        self._subscribers: list[Callable[[EngineEvent], None]] = []
        self._embedder_event: EngineEvent | None = None       # `embedder_status`
        self._cancels: dict[str, set[threading.Event]] = {}     # one Event per queued or running turn
        self._open_cancels: dict[str, set[threading.Event]] = {}   # one Event per queued or running open
        self._cancels_lock = threading.Lock()
        self.focused: str | None = None              # written on the engine thread only (`focus`)
        self.last_activity = clock()                 # written on the engine thread only (`ensure_model`, turns)
        try:
            self.history = HistoryDB(self.settings.data_dir / "history.sqlite3")
        except BaseException:
            self.thread.stop()
            self.owner.release()
            raise
        self.model: LoadedModel | None = None          # exactly while the model is loaded
        self.lifecycle = ConversationLifecycle(self.history, emit=self.emit, clock=clock,
                                               ensure_model=self.ensure_model)
        self.turns = TurnJobs(self.lifecycle, emit=self.emit, clock=clock, on_activity=self._stamp_activity,
                              on_idle=lambda work: self.thread.submit(work, priority=BACKGROUND,
                                                                          command=Command.EMBED),
                              glosses=GlossWriter(lambda: self.thread.pending() > 0 or bool(self.thread.streaming())))
        self.lifecycle.streaming = self.thread.streaming_conversations     # they keep their slots
        self.settings_hub.subscribe(self.lifecycle.adopt_settings)        # open conversations' memories
        self.settings_hub.subscribe(self._embedder_changed, fields=("embedder",))
        follow_ttl_settings(self.settings_hub, lambda: self.kvfiles)       # the files outlive the model
        self.ready: Future = self.thread.submit(self._load, priority=FOREGROUND, command=Command.LOAD)
        self.sweeps = Sweeps(self, scheduler) if scheduler is not False else None
        if wait:
            try:
                self.ready.result()
            except BaseException:
                self.close()            # no scheduler, engine thread or database left behind by a failed load
                raise

    @property
    def settings(self) -> Settings:
        """The settings now: an immutable snapshot (any thread); changed by `apply_settings` and `reload`."""
        return self.settings_hub.current

    # -- events -----------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[EngineEvent], None]) -> None:
        self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[EngineEvent], None]) -> None:
        """Stop handing events to `callback` (a no-op when it was not subscribed)."""
        with contextlib.suppress(ValueError):
            self._subscribers.remove(callback)

    def emit(self, event: EngineEvent) -> None:
        """Hand `event` to every subscriber (on the calling thread; a failing subscriber is logged)."""
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - an observer must not break the engine
                log.exception("event subscriber failed")

    # -- model ------------------------------------------------------------------------------
    def _load(self) -> ModelInfo:
        """Load the model the settings name and its resources (`LoadedModel`), open it to conversations, prewarm
        (engine thread)."""
        settings = self.settings
        self.emit(EngineEvent(EventKind.MODEL_LOADING, f"loading {settings.model_path or 'embedded model'}"))
        model = self.model = LoadedModel.load(self.settings_hub, self.emit, self.clock, self.backend)
        model.rt.holds_engine = self.thread.on_engine     # a reply's stream thread touches llama.cpp in its steps
        model.rt.step_boundary = self.thread.step_boundary
        model.rt.token_boundary = self.thread.token_boundary
        rt = model.rt
        rt.boundary_if_spent = lambda: self.thread.boundary_if_spent(rt.pace.token_step_s)
        rt.step_tokens = lambda: (self.thread.prefill_tokens_per_step(rt.pace.prompt_token_s, rt.pace.token_step_s,
                                                                      self.settings.prefill_step_tokens)
                                  if self.thread.contended() else 0)
        if hasattr(model.rt, "run_step"):              # llama.cpp's runtime: replies in one context share steps
            model.rt.joins_step, model.rt.await_step = self.thread.joins_step, self.thread.await_step
            self.thread.shared_step = model.rt.run_step
        self.lifecycle.attach(model)
        if not model.rt.eviction_supported:
            self.emit(EngineEvent(EventKind.ERROR, f"{model.rt.eviction_note}; chat works without eviction"))
        shared = 0
        if self.prewarm:
            shared = len(self.warm_default_prefix().tokens)
            if model.embedder.enabled and recovery_backend(settings.recovery).evicts:
                self._warm_embedder(model.embedder)
        warning = model.fit_warning(shared) if recovery_backend(settings.recovery).evicts else None
        if warning:
            self.emit(EngineEvent(EventKind.ERROR, warning))
        info = self._info = model.info
        self.emit(EngineEvent(EventKind.MODEL_LOADED, f"{info.name} on {info.device}"))
        return info

    def _stream_limit(self) -> int:
        """How many replies may stream at once: the `parallel_replies` setting, within the slots less one (a slot
        stays free for opening and switching conversations). One with the attention capture (one capture a decode).
        In one context for every slot their tokens share each step's decode; with a context a slot, they take turns."""
        settings = self.settings
        if settings.attention_capture:
            return 1
        return max(1, min(settings.parallel_replies, settings.slots - 1))

    def model_info(self) -> ModelInfo:
        self.ready.result()
        return self._info

    @property
    def model_loaded(self) -> bool:
        return self.model is not None

    def diagnostics(self) -> LoadedModel | None:
        """The loaded model's parts (runtime, KV primitives, template, shared prefixes, pool, slots, attention
        capture, embedder, chunk index) for benches, tests and diagnostics; None while it is unloaded. Their state
        belongs to the engine thread: change it only there (`thread.call`); the app and the endpoint use the
        methods above instead."""
        return self.model

    @property
    def kvfiles(self) -> KVFileStore | None:
        """The KV files of the model loaded last (on disk: they outlive an unload); None before the first load."""
        return self.lifecycle.files

    def ensure_model(self) -> LoadedModel:
        """The loaded model, loaded back if the idle sweep unloaded it (engine thread). Every path that uses the
        model for the user comes through here, so here is where activity is stamped: a reload that did not stamp
        it would be unloaded again by the next idle check (issue 25). Sweeps never call this."""
        self.last_activity = self.clock()
        if self.model is None:
            self._load()
            self.last_activity = self.clock()          # a slow load is not idle time either
        return self.model

    def _stamp_activity(self, now: float) -> None:
        self.last_activity = now

    def _unload(self, reason: str = "close") -> None:
        """Persist every open conversation, then free the model and its contexts (VRAM) in one place. `reason`
        (idle, reload, close) is in the event: only an idle unload says the model comes back on the next message."""
        if self.model is None:
            return
        self.lifecycle.detach()
        model, self.model = self.model, None
        self.thread.shared_step = None                # LOAD runs while no reply streams: none waits for a step
        model.close()
        said = {"idle": "model unloaded after idle; it comes back on the next message",
                "reload": "model unloaded for the model change"}.get(reason, f"model unloaded ({reason})")
        self.emit(EngineEvent(EventKind.MODEL_UNLOADED, said, detail={"reason": reason}))

    def apply_settings(self, new: Settings) -> list[str]:
        """Adopt the settings that apply now (the budget reaches open conversations at once) and
        return the names that need `reload` to take effect."""
        new.validate()
        pending = new.needs_reload(self.settings)

        def apply() -> None:
            adopted = self.settings.with_now_of(new)
            sizing = ("budget_tokens", "block_tokens", "tail_fraction", "recovery")
            resized = any(getattr(adopted, n) != getattr(self.settings, n) for n in sizing)
            if resized and recovery_backend(adopted.recovery).evicts and self.model is not None:   # unloaded: later
                require_budget(adopted.budget_tokens, *self._tightest_hold(adopted), adopted)
            self.settings_hub.apply(adopted)               # each consumer hears of the fields it uses

        self.thread.call(apply, priority=FOREGROUND, command=Command.LOAD)
        return pending

    def min_budget_tokens(self, settings: Settings | None = None) -> int:
        """The smallest `budget_tokens` that works under `settings` (default: the engine's) for a new
        conversation and every open one: a smaller budget is refused (`apply_settings`, `set_budget`, a new
        conversation). Loads the model if it was unloaded (ModelLoadError when it cannot)."""
        def run() -> int:
            self.ensure_model()
            settings_now = settings or self.settings
            return min_budget_tokens(sum(self._tightest_hold(settings_now)), settings_now)
        return self.thread.call(run, priority=FOREGROUND)

    def _tightest_hold(self, settings: Settings) -> tuple[int, int]:
        """What the settings' budget must hold before a reply's room, as (prefix, kept) tokens: the largest of a
        new conversation's shared prefix under `settings` and each open conversation's prefix with (for those
        that follow the settings' budget) its kept files and pinned blocks."""
        prefix = self.model.prefixes.for_conversation(system_prompt_of(settings), tools_of(settings))
        held = [(len(prefix.tokens), 0), *((s.memory.prefix_tokens,
                                            s.memory.kept_tokens if s.memory.own_budget is None else 0)
                                           for s in self.lifecycle.open_states())]
        return max(held, key=lambda pair: min_budget_tokens(sum(pair), settings))

    def switch_embedder(self) -> None:
        """Vectors of the old embedder mean nothing to the new one: open conversations drop theirs (recomputed
        when a decision needs them) and get their task focus recomputed; saved files are adapted on open."""
        embedder = self.model.embedder = Embedder(self.settings.embedder)
        for state in self.lifecycle.open_states():
            focus = focus_from_history(self.history.messages(state.id), embedder, self.settings)
            state.memory.adopt_embedder(embedder, focus)
        if embedder.enabled and recovery_backend(self.settings.recovery).evicts:
            self._warm_embedder(embedder)

    def _warm_embedder(self, embedder: Embedder) -> None:
        """Load the embedder on its own thread, never the engine's: no turn waits for it (one meanwhile recalls by
        words, `Embedder.warming`); events say when it starts, whether it is exported first (the first start
        with this model: up to a minute), and when it is ready."""
        def started(first_use: bool) -> None:
            said = ("preparing the recall model for its first use (once; until it is ready, recall matches words)"
                    if first_use else "loading the recall model")
            self._say_embedder(EngineEvent(EventKind.EMBEDDER_WARMING, said, detail={"first_use": first_use}))

        def ready(seconds: float, error: BaseException | None) -> None:
            said = (f"the recall model is ready ({seconds:.1f} s)" if error is None
                    else f"the recall model could not load ({error}); recall matches words")
            failure = None if error is None else str(error)
            self._say_embedder(EngineEvent(EventKind.EMBEDDER_READY, said, detail={"seconds": round(seconds, 2),
                                                                                   "error": failure}))
        embedder.warm_in_background(started, ready)

    def _say_embedder(self, event: EngineEvent) -> None:
        self._embedder_event = event
        self.emit(event)

    def embedder_status(self) -> EngineEvent | None:
        """The embedder's last event (`embedder_warming` or `embedder_ready`), None before its first load: what a
        window that subscribed after it shows."""
        return self._embedder_event

    def _embedder_changed(self, old: Settings, new: Settings) -> None:
        if self.model is not None:                     # unloaded: the next load builds the new one
            self.switch_embedder()

    def reload(self, new: Settings) -> Future:
        """Load the model `new` names; on failure the previous model is loaded back and the error raised."""
        def swap() -> ModelInfo:
            old = self.settings
            self._unload("reload")
            try:
                self.settings_hub.apply(new)
                return self._load()
            except EvokeError:
                self.settings_hub.apply(old)
                if self.ready.exception() is None:         # the previous model had loaded: bring it back
                    self._load()
                raise

        future = self.thread.submit(swap, priority=FOREGROUND, command=Command.LOAD)
        future.add_done_callback(lambda f: None if f.exception() else setattr(self, "ready", f))
        return future

    def unload_model(self, reason: str = "idle") -> None:
        self.thread.call(lambda: self._unload(reason), command=Command.LOAD)

    def wait_idle(self) -> None:
        """Block until every job queued so far, background ones included, has run, and no reply streams."""
        self.thread.call(lambda: None, priority=BACKGROUND + 1, command=Command.DRAIN)

    def warm_default_prefix(self) -> Prefix:
        """The prefix a new conversation gets, decoded now if it was dropped (engine thread); it and the default
        prompt without tools (what the endpoint gives a request that sends neither) are public: shared by every
        owner, where any other prefix is shared only within the owner that asked for it."""
        system_prompt = system_prompt_of(self.settings)
        self.model.prefixes.declare_public(system_prompt, [])
        return self.model.prefixes.for_conversation(system_prompt, tools_of(self.settings))

    # -- conversations ----------------------------------------------------------------------
    def new_conversation(self, system_prompt: str | None = None, tools: list[dict] | None = None,
                         title: str | None = None, source: str | None = None,
                         owner: str | None = None) -> Conversation:
        """A new conversation; `owner` (the endpoint's client, with `source="api"`) is stored with it from the
        start, so its shared prefix is that owner's (or the public prewarmed one) and its chunk reuse stays within."""
        self.ready.result()
        conversation_id = uuid.uuid4().hex
        system_prompt = system_prompt_of(self.settings) if system_prompt is None else system_prompt
        tools = tools_of(self.settings) if tools is None else tools
        state = self.thread.call(self.lifecycle.create, conversation_id, title or "New conversation",
                                 system_prompt, tools, source, owner, command=Command.OPEN, about=conversation_id)
        return Conversation(self, state.id)

    def prefix_decoded_at(self, conversation_id: str) -> float | None:
        """When the shared prefix an open conversation holds was decoded (`time.monotonic`: usage counts it as
        decoded for a request that arrived before); None when the conversation is not in a slot (any thread)."""
        state = self.lifecycle.get(conversation_id)
        prefix = state.prefix if state is not None else None
        return None if prefix is None else prefix.decoded_at

    def open_conversation(self, conversation_id: str) -> Conversation:
        self.thread.call(self.lifecycle.open, conversation_id, priority=FOREGROUND, command=Command.OPEN,
                         about=conversation_id)
        return Conversation(self, conversation_id)

    def begin_open(self, conversation_id: str, priority: int = FOREGROUND) -> Future:
        """Open a conversation (restore its KV file or rebuild it from history) without waiting; the Future gives
        its handle, or raises `RebuildCancelled` when `cancel_open` stopped the rebuild. The endpoint's imports
        open at NORMAL priority, behind the turns already waiting. It runs as a stream (`Command.REBUILD`): a
        rebuild's prefill chunks take turns with replies, so a long history holds no other conversation behind it."""
        cancel = threading.Event()
        with self._cancels_lock:
            self._open_cancels.setdefault(conversation_id, set()).add(cancel)

        def run() -> Conversation:
            self.lifecycle.open(conversation_id, cancel)
            return Conversation(self, conversation_id)

        def finished(_: Future) -> None:
            with self._cancels_lock:
                events = self._open_cancels.get(conversation_id)
                if events is not None:
                    events.discard(cancel)
                    if not events:
                        del self._open_cancels[conversation_id]
        future = self.thread.submit(run, priority=priority, command=Command.REBUILD, about=conversation_id)
        future.add_done_callback(finished)
        return future

    def cancel_open(self, conversation_id: str) -> None:
        """Stop the pending and running opens of a conversation between two prefill blocks (any thread); an open
        that needs no rebuild, or has finished, is not affected."""
        with self._cancels_lock:
            events = list(self._open_cancels.get(conversation_id, ()))
        for event in events:
            event.set()

    def persist(self, conversation_id: str, ttl_class: str | None = None) -> bool:
        return self.thread.call(lambda: self.lifecycle.persist(self.lifecycle.open(conversation_id), ttl_class),
                                command=Command.OPEN, about=conversation_id)

    def persist_soon(self, conversation_id: str) -> Future:
        """Write an open conversation's KV file when the engine thread has nothing more urgent (BACKGROUND): the
        endpoint asks after its turns, so a kill -9 costs the restart only the turns since, not a rebuild of the
        whole history (minutes under a tiny budget). A conversation no longer open is skipped (False)."""
        def write() -> bool:
            state = self.lifecycle.get(conversation_id)
            return state is not None and self.lifecycle.persist(state)
        return self.thread.submit(write, priority=BACKGROUND, command=Command.OPEN, about=conversation_id)

    def release_conversation(self, conversation_id: str, persist: bool = True) -> None:
        """Persist a conversation (unless told not to) and free its slot and RAM."""
        def release() -> None:
            state = self.lifecycle.get(conversation_id)
            if state is not None:
                self.lifecycle.release(state, persist=persist)
        self.thread.call(release, command=Command.OPEN, about=conversation_id)

    def release_soon(self, conversation_id: str) -> Future:
        """Persist a conversation to its KV file and free its slot and RAM, as a job about it queued at NORMAL priority
        (behind the turns already waiting; never in the middle of its reply: a job about a streaming conversation
        waits for it to end); the next use reopens it from the file. The endpoint releases the live conversations
        past its caps this way. One not open, or the focused one, is left as it is (False)."""
        def release() -> bool:
            state = self.lifecycle.get(conversation_id)
            if state is None or conversation_id == self.focused:
                return False
            self.lifecycle.release(state)
            self.emit(EngineEvent(EventKind.RELEASED, "conversation saved to disk and released",
                                  conversation_id=conversation_id))
            return True
        return self.thread.submit(release, priority=NORMAL, command=Command.OPEN, about=conversation_id)

    def conversations(self) -> list[ConversationInfo]:
        rows = self.history.list_conversations()
        out = []
        for row in rows:
            stats = self.lifecycle.latest_stats(row.id)
            memory = stats.memory if stats is not None else None
            if memory is None:
                memory = "disk" if self.kvfiles is not None and self.kvfiles.has(row.id) else "none"
            parent = row.settings.get("forked_from") if isinstance(row.settings, dict) else None
            meta = row.settings if isinstance(row.settings, dict) else {}
            out.append(ConversationInfo(row.id, row.title, row.updated_at, row.pinned, memory,
                                        forked_from=parent if isinstance(parent, str) else None,
                                        source=meta.get("source", "app"), stateless=bool(meta.get("stateless"))))
        return out

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Conversations whose title holds every word of `query` (`SearchHit.is_title`), then live messages (text
        or attachment names) holding them, best first, each with its conversation's title and a snippet marking
        the matches; safe for any input (no FTS5 syntax is parsed). Reads SQLite only: no engine thread, no model
        needed."""
        return self.history.search(query, limit, titles=True)

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        self.thread.call(self.lifecycle.rename, conversation_id, title, priority=FOREGROUND, command=Command.WRITE,
                         about=conversation_id)

    def pin_conversation(self, conversation_id: str, pinned: bool) -> None:
        self.thread.call(self.lifecycle.set_pinned, conversation_id, pinned, priority=FOREGROUND,
                         command=Command.WRITE, about=conversation_id)

    def delete_conversation(self, conversation_id: str) -> None:
        self.thread.call(self.lifecycle.forget, conversation_id, command=Command.WRITE, about=conversation_id)
        self.history.delete(conversation_id)

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """The model's tokens for `text`, special tokens parsed unless `special` is False (a message's content:
        the engine never parses it); loads the model if it was unloaded."""
        return self.thread.call(lambda: self.ensure_model().rt.tokenize(text, parse_special=special),
                                priority=FOREGROUND)

    def focus(self, conversation_id: str | None) -> Future:
        """Requests of the focused conversation are served before the others, and the eviction sweep keeps it
        open. Written on the engine thread (a sweep sees one value throughout); the Future says when."""
        def write() -> None:
            self.focused = conversation_id
        return self.thread.submit(write, priority=FOREGROUND, command=Command.WRITE, about=conversation_id)

    # -- one conversation: what its handle reads and changes -------------------------------
    def _on_open(self, conversation_id: str, job: Callable[[ConversationState], Any], priority: int = NORMAL) -> Any:
        """`job(state)` on the engine thread, the conversation opened first (loaded, restored or rebuilt)."""
        return self.thread.call(lambda: job(self.lifecycle.open(conversation_id)), priority=priority,
                                about=conversation_id)

    def _change_open(self, conversation_id: str, change: Callable[[ConversationState], None]) -> None:
        """Apply `change` to the open conversation, then refresh its stats snapshot (foreground)."""
        def run(state: ConversationState) -> None:
            change(state)
            self.lifecycle.refresh(state)
        self._on_open(conversation_id, run, FOREGROUND)

    def conversation_title(self, conversation_id: str) -> str:
        row = self.history.get_conversation(conversation_id)
        return row.title if row else ""

    def messages(self, conversation_id: str) -> list[dict]:
        """Live messages; "interrupted" marks a reply still streaming or cut short (the app was killed)."""
        return [{"role": m.role, "text": m.text, "attachments": m.attachments, "created_at": m.created_at,
                 "id": m.id, "extra": m.extra, "interrupted": m.interrupted}
                for m in self.history.messages(conversation_id)]

    def versions(self, conversation_id: str) -> dict[int, list[dict]]:
        return versions_of(self.history, conversation_id)

    def undelete(self, conversation_id: str, message_ids: Sequence[int]) -> list[int]:
        return self.thread.call(undelete, self.history, self.lifecycle, conversation_id, list(message_ids),
                                priority=FOREGROUND, command=Command.EDIT, about=conversation_id)

    def stats(self, conversation_id: str) -> ConversationStats:
        """The latest memory snapshot (zeros before the conversation is first opened); never waits."""
        return self.lifecycle.latest_stats(conversation_id) or ConversationStats(conversation_id)

    def template_history(self, conversation_id: str) -> list[dict]:
        return self._on_open(conversation_id, lambda state: [dict(m) for m in state.history])

    def blocks(self, conversation_id: str, *, with_text: bool = False) -> list[dict]:
        return self._on_open(conversation_id, lambda state: [{**b.summary(), **({"text": b.text} if with_text else {})}
                                                             for b in state.memory.table.blocks])

    def vector_dims(self, conversation_id: str) -> tuple[set[int], int | None]:
        def read(state: ConversationState) -> tuple[set[int], int | None]:
            memory = state.memory
            memory.ensure_embeddings(memory.table.blocks)
            dims = {b.embedding.shape[0] for b in memory.table.blocks if b.embedding is not None}
            return dims, None if memory.focus.vector is None else memory.focus.vector.shape[0]
        return self._on_open(conversation_id, read)

    def set_budget(self, conversation_id: str, tokens: int | None) -> None:
        """A budget for this conversation alone: it keeps it through changes of the settings' budget and in its KV
        file; None: it follows the settings' budget again."""
        self._change_open(conversation_id, lambda state: state.memory.set_budget(tokens))

    def reset_focus(self, conversation_id: str) -> None:
        self._on_open(conversation_id, lambda state: state.memory.reset_focus(), FOREGROUND)

    def pin_block(self, conversation_id: str, name: str, pinned: bool = True, priority: float | None = None) -> None:
        self._change_open(conversation_id, lambda state: state.memory.pin(name, pinned, priority))

    def keep_file(self, conversation_id: str, file_name: str, keep: bool = True) -> list[str]:
        """Keep the attached file `file_name` in the conversation's context until it is let go (`keep=False`): its
        saved blocks come back now and none of them is evicted while kept (`ConversationMemory.keep_file`). The
        names of the blocks brought back; KeyError for no such file, BudgetError when the budget cannot hold it
        beside a reply (nothing changes then)."""
        def run(state: ConversationState) -> list[str]:
            if keep:
                self.lifecycle.ensure_slot(state)          # what comes back lands in its slot
            brought = [b.name for b in state.memory.keep_file(file_name, keep)]
            self.lifecycle.refresh(state)
            return brought
        return self._on_open(conversation_id, run, FOREGROUND)

    def check(self, conversation_id: str) -> None:
        """Assert the conversation's block table mirrors llama.cpp's sequence (tests)."""
        self._on_open(conversation_id, lambda state: state.memory.check())

    # -- turns ------------------------------------------------------------------------------
    def submit(self, conversation_id: str, text: str, attachments: Sequence[Attachment] = (), *,
               on_token: Callable[[str], None] | None = None, role: str = "user", extra: dict | None = None,
               on_stored: Callable[[], None] | None = None, **sampling) -> Future:
        """Start a turn; the Future gives the Reply. `on_token` runs on the engine thread. `role="tool"`
        with `extra={"tool_call_id": ...}` sends a tool result as the turn's input. `on_stored` (engine thread)
        hears that the message is in SQLite; with it, a turn that fails later keeps its message."""
        if role not in ("user", "tool"):
            raise ValueError(f"a turn's input is a user or tool message, not {role!r}")
        return self._submit_turn(conversation_id, self.turns.turn, on_token, sampling, text, list(attachments),
                                 role=role, extra=extra, on_stored=on_stored)

    def _submit_turn(self, conversation_id: str, job: Callable, on_token: Callable[[str], None] | None,
                     sampling: dict, *args, command: Command = Command.TURN, **kwargs) -> Future:
        params = SamplingParams.from_settings(self.settings, **sampling)     # a frozen snapshot: any thread
        cancel = threading.Event()                   # this turn's own: a later submit never clears it
        with self._cancels_lock:
            self._cancels.setdefault(conversation_id, set()).add(cancel)
        priority = FOREGROUND if conversation_id == self.focused else NORMAL   # read here, written on the thread
        future = self.thread.submit(job, conversation_id, *args, params=params, on_token=on_token, cancel=cancel,
                                    priority=priority, command=command, about=conversation_id, on_cancel=cancel.set,
                                    **kwargs)
        future.add_done_callback(lambda _: self._turn_finished(conversation_id, cancel))
        return future

    def _turn_finished(self, conversation_id: str, cancel: threading.Event) -> None:
        with self._cancels_lock:
            events = self._cancels.get(conversation_id)
            if events is not None:
                events.discard(cancel)
                if not events:
                    del self._cancels[conversation_id]

    def jobs(self) -> list[Job]:
        """The engine thread's job running now (first) and those queued: what each is and which conversation it is
        about (`worker.Job`); a future the engine hands out carries its own as `future.job`."""
        return self.thread.jobs()

    def reply_counts(self) -> tuple[int, int]:
        """(replies being written now, replies waiting for their turn to start); any thread."""
        return self.thread.reply_counts()

    def suspended_replies(self) -> list[Job]:
        """Endpoint replies paused while the window's reply streams (at the reply limit); any thread."""
        return self.thread.suspended()

    def generating(self) -> set[str]:
        """The conversations whose reply is being written now (the window's and the endpoint's); any thread."""
        return self.thread.streaming_conversations()

    def queue_position(self, job_id: int) -> int | None:
        """0 while the job runs, N while N-1 queued replies start before it, None once done or unknown; any thread."""
        return self.thread.queue_position(job_id)

    def cancel_job(self, job_id: int) -> bool:
        """Drop a queued job or stop a running turn or completion by its id (a turn keeps its partial text); False
        when no such job is queued or running."""
        return self.thread.cancel(job_id)

    def cancel(self, conversation_id: str) -> None:
        """Stop the running and queued turns of a conversation (partial text is kept)."""
        with self._cancels_lock:
            events = list(self._cancels.get(conversation_id, ()))
        for event in events:
            event.set()

    def embed_ahead(self, text: str) -> Future:
        """Embed a message while it is typed, on idle time (BACKGROUND): the turn that sends the same text then
        finds its vector made (`Embedder.embed_one`) and decides without embedding. Nothing when the model is
        unloaded (typing does not load it), similarity is off, or the embedder is still warming."""
        def embed() -> None:
            model = self.model
            if model is not None and model.embedder.enabled and not model.embedder.warming and text.strip():
                model.embedder.embed_one(text)
        return self.thread.submit(embed, priority=BACKGROUND, command=Command.EMBED)

    def embed_draft(self, text: str) -> None:
        """The user is typing `text` (a short pause): its vector starts now on the embedder's own thread, not the
        engine's, so an Enter right after the last keystroke finds it made or on its way (`Embedder.embed_soon`) and
        never waits behind it. Nothing when the model is unloaded (typing loads nothing), similarity is off, the
        embedder is warming, the text is kept or on its way already, or an earlier draft is still embedding (a long
        draft typed fast: the next pause starts the newest). Callable from any thread."""
        model = self.model
        if model is not None and text.strip():
            model.embedder.embed_soon(text, unless_busy=True)

    def prepare_ahead(self, conversation_id: str, text: str, attachments: Sequence[Attachment] = (), *,
                      max_tokens: int | None = None) -> Future:
        """The user paused typing `text` into `conversation_id`: on idle time (BACKGROUND) the message is embedded
        and, where the conversation is open, its slot taken, its input rendered and tokenized and its recovery
        decided and brought back where the budget has room (`TurnJobs.prepare_ahead`), so that sending the same
        text waits for none of it. The Future gives True when the conversation was prepared. Typing loads and
        opens nothing; a turn that sends other text (or another `max_tokens` than the one prepared for, the
        settings' by default) decides afresh."""
        if max_tokens is None:
            max_tokens = SamplingParams.from_settings(self.settings).max_tokens

        def prepare() -> bool:
            model = self.model
            if model is None or not text.strip():
                return False
            if model.embedder.enabled and not model.embedder.warming:
                model.embedder.embed_one(text)
            return self.turns.prepare_ahead(conversation_id, text, list(attachments), max_tokens)
        return self.thread.submit(prepare, priority=BACKGROUND, command=Command.PREPARE, about=conversation_id)

    def complete(self, tokens: list[int], *, on_token: Callable[[str], None] | None = None,
                 cancel: threading.Event | None = None, **sampling) -> Future[Completion]:
        """A stateless raw completion of `tokens` (no conversation, nothing kept: `conversations.completion`): a
        stream at LATENCY priority (after the window's turn, before endpoint replies), one at a time, taking turns
        with the replies' steps; `cancel` stops it with the text so far; ContextFullError when the free cells do not
        hold the prompt."""
        params = SamplingParams.from_settings(self.settings, **sampling)
        cancel = cancel or threading.Event()
        return self.thread.submit(lambda: complete(self.ensure_model(), tokens, params, on_token, cancel),
                                  priority=LATENCY, command=Command.COMPLETE, on_cancel=cancel.set)

    # -- editing ----------------------------------------------------------------------------
    def regenerate(self, conversation_id: str, *, on_token: Callable[[str], None] | None = None,
                   **sampling) -> Future:
        """Drop the last reply (its cells and its live row) and sample a new one: no prefill."""
        return self._submit_turn(conversation_id, self.turns.regenerate, on_token, sampling,
                                 command=Command.REGENERATE)

    def edit(self, conversation_id: str, message_index: int, new_text: str,
             attachments: Sequence[Attachment] | None = None, *, on_token: Callable[[str], None] | None = None,
             **sampling) -> Future:
        """Replace user message `message_index` (and drop all after it, KV rolled back) and send `new_text`;
        `attachments=None` keeps the message's own. The old rows stay as superseded versions."""
        return self._submit_turn(conversation_id, self.turns.turn, on_token, sampling, new_text,
                                 None if attachments is None else list(attachments), edit_index=message_index,
                                 command=Command.EDIT)

    def continue_reply(self, conversation_id: str, *, on_token: Callable[[str], None] | None = None,
                       **sampling) -> Future:
        """Sample on after the last reply's text (stopped, cut at max tokens or interrupted by a crash): the same
        message grows; the Reply's text is the whole reply, `on_token` hears only the new pieces."""
        return self._submit_turn(conversation_id, self.turns.continue_reply, on_token, sampling,
                                 command=Command.CONTINUE)

    def switch_version(self, conversation_id: str, message_id: int) -> int:
        """Make version `message_id` of a message current (`versions()` lists them): the messages that followed
        the version shown now leave with it and those that followed `message_id` come back; the KV is cut there
        and decoded on from the history. Returns the message's position."""
        return self.thread.call(branches.switch_version, self.lifecycle, conversation_id, message_id,
                                priority=FOREGROUND, command=Command.EDIT, about=conversation_id)

    def edit_reply(self, conversation_id: str, message_index: int, new_text: str) -> int:
        """Replace the text of reply `message_index` (a new version; the old one and the messages after it stay
        reachable through `switch_version`); the KV is rebuilt from there. Returns the new row's id."""
        return self.thread.call(branches.edit_reply, self.lifecycle, conversation_id, message_index, new_text,
                                priority=FOREGROUND, command=Command.EDIT, about=conversation_id)

    def truncate(self, conversation_id: str, n_messages: int) -> None:
        """Keep the first `n_messages` live messages; the rest leave the history and the KV."""
        self.thread.call(editing.truncate, self.lifecycle, conversation_id, n_messages, priority=FOREGROUND,
                         command=Command.EDIT, about=conversation_id)

    def fork(self, conversation_id: str, message_index: int) -> Conversation:
        """A new conversation with the messages up to `message_index`, its KV cells shared with the parent."""
        child_id = self.thread.call(editing.fork, self.lifecycle, conversation_id, message_index, priority=FOREGROUND,
                                    command=Command.EDIT, about=conversation_id)
        return Conversation(self, child_id)

    def delete_message(self, conversation_id: str, message_index: int) -> None:
        """Remove one message from the conversation (kept as deleted until `compact_history`)."""
        self.thread.call(editing.delete_message, self.lifecycle, conversation_id, message_index, priority=FOREGROUND,
                         command=Command.EDIT, about=conversation_id)

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

    def export_all(self, folder: str | os.PathLike[str], format: str = "markdown") -> list[str]:
        """Every conversation into `folder`, one file each (conversations/exchange.write_all); the paths."""
        return [str(path) for path in write_all(self.history, Path(folder), format)]

    def import_conversation(self, data: str | bytes | dict) -> Conversation:
        """A new conversation from `export(...)` (JSON or Markdown), each message keeping its time; its KV is
        built when it is first opened."""
        imported = parse_conversation(data)
        conversation_id = uuid.uuid4().hex
        store_imported(self.history, conversation_id, imported, {"tools": imported.tools, "imported": True})
        return Conversation(self, conversation_id)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        if self.sweeps is not None:
            self.sweeps.shutdown()
        embedder = self.model.embedder if self.model is not None else None
        try:
            self.thread.call(self._unload, command=Command.LOAD)
        finally:
            self.thread.stop()
            if embedder is not None:       # its background load builds ONNX Runtime's session in C++: a process
                embedder.wait_warm(EMBEDDER_LOAD_WAIT_S)   # that ends meanwhile aborts as that thread comes back
            self.history.close()
            self.owner.release()                       # last: another engine may take the folder now

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
