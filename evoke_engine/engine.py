"""The Engine: one model, its conversations, slots and shared prefixes, behind one engine thread.

Invariants: every llama.cpp call runs on the engine thread (`EngineThread`); public methods
are safe from any thread and never hand out internal structures (snapshots and futures only);
SQLite history is written before a reply starts, so no user message is lost.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from . import editing, live_settings
from .blocks import Block
from .embedder import Embedder
from .errors import BudgetError, EvokeError, RestoreError
from .events import EngineEvent
from .exchange import parse_json, to_json, to_markdown
from .kv import KVCache
from .memory import ConversationMemory
from .pool import SavedPool
from .runtime import ModelInfo, Runtime
from .sampling import SamplingParams
from .settings import Settings
from .slots import Prefix, PrefixRegistry, SlotRegistry, prefix_key
from .snapshot import SnapshotError, decode_payload, encode_payload
from .snapshot_fit import fit_snapshot, focus_from_history
from .store.errors import StoreError
from .store.history import DELETED, HistoryDB
from .store.kvfiles import KVFileStore, model_hash
from .template import ChatTemplate
from .turn import Attachment, Reply, number_turns, regenerate_reply, replay_input, replay_reply, run_turn
from .worker import BACKGROUND, FOREGROUND, NORMAL, EngineThread

log = logging.getLogger(__name__)
RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def default_system_prompt() -> str:
    return (RESOURCES / "system_prompt.txt").read_text().strip()


def default_tools() -> list[dict]:
    return json.loads((RESOURCES / "tools.json").read_text())


def system_message(system_prompt: str, tools: list[dict]) -> dict:
    """The template message that opens every conversation: the system prompt with the tool schemas."""
    return {"role": "system", "content": system_prompt + tools_text(tools)}


def tools_text(tools: list[dict]) -> str:
    if not tools:
        return ""
    lines = ["", "", "# Tools", "You can call these read-only tools; answer with a JSON object "
             '{"name": ..., "arguments": {...}} to call one.']
    lines += [json.dumps(tool["function"], separators=(",", ":")) for tool in tools]
    return "\n".join(lines)


@dataclass
class ConversationInfo:
    id: str
    title: str
    updated_at: float
    pinned: bool
    memory: str            # slot | ram | disk | none
    forked_from: str | None = None
    source: str = "app"    # app | api (made through the OpenAI-compatible endpoint)


@dataclass
class ConversationState:
    """Engine-thread state of one open conversation."""

    id: str
    title: str
    system_prompt: str
    tools: list[dict]
    memory: ConversationMemory
    history: list[dict] = field(default_factory=list)     # template messages
    prefix: Prefix | None = None
    pinned: bool = False
    last_used: float = 0.0

    @property
    def ttl_class(self) -> str:
        return "extended" if self.pinned else "long"

    @property
    def system_message(self) -> dict:
        return system_message(self.system_prompt, self.tools)


class Engine:
    def __init__(self, settings: Settings | None = None, *, wait: bool = True, scheduler=None,
                 clock: Callable[[], float] = time.time, prewarm: bool = True) -> None:
        self.settings = dataclasses.replace(settings) if settings is not None else Settings()   # ours to mutate
        self.prewarm = prewarm
        self.clock = clock
        self.thread = EngineThread()
        self._subscribers: list[Callable[[EngineEvent], None]] = []
        self._states: dict[str, ConversationState] = {}
        self._snapshots: dict[str, dict] = {}
        self._cancels: dict[str, set[threading.Event]] = {}     # one Event per queued or running turn
        self._cancels_lock = threading.Lock()
        self.focused: str | None = None
        self.last_activity = clock()
        self.history = HistoryDB(self.settings.data_dir / "history.sqlite3")
        self.rt: Runtime | None = None
        self.kvfiles: KVFileStore | None = None
        self.ready: Future = self.thread.submit(self._load, self.settings, priority=FOREGROUND)
        self.sweeps = None
        if scheduler is not False:
            from .scheduler import Sweeps

            self.sweeps = Sweeps(self, scheduler)
        if wait:
            self.ready.result()

    # -- events -----------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[EngineEvent], None]) -> None:
        self._subscribers.append(callback)

    def _emit(self, event: EngineEvent) -> None:
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - an observer must not break the engine
                log.exception("event subscriber failed")

    # -- model ------------------------------------------------------------------------------
    def _load(self, settings: Settings) -> ModelInfo:
        self._emit(EngineEvent("model_loading", f"loading {settings.model_path or 'embedded model'}"))
        try:
            rt = Runtime(settings)
        except EvokeError as exc:
            self._emit(EngineEvent("load_failed", str(exc)))
            raise
        self.rt = rt
        self.kv = KVCache(rt)
        self.template = ChatTemplate(rt.meta("tokenizer.chat_template"), bos_token=rt.token_text("bos"),
                                     eos_token=rt.token_text("eos"))
        self.pool = SavedPool(settings.ram_budget_bytes, settings.cache_dir / "spill",
                              on_spill=lambda b: self._emit(EngineEvent("spilled", f"{b.name} spilled to disk",
                                                                         block=b.name, tokens=b.n_tokens)))
        self.embedder = Embedder(settings.embedder)
        self.slots = SlotRegistry(settings.slots)
        self.prefixes = PrefixRegistry(rt.prefix_seqs)
        ttls = live_settings.ttl_seconds(settings)
        self.kvfiles = KVFileStore(settings.cache_dir, model_hash(rt.model_path, settings.kv_cache_type, rt.n_ctx,
                                                                  settings.slots), ttls, clock=self.clock)
        self.kvfiles.check(fix=True)
        if not rt.eviction_supported:
            self._emit(EngineEvent("error", f"{rt.eviction_note}; chat works without eviction"))
        shared = 0
        if self.prewarm:
            shared = len(self._prefix_for(self._default_system_prompt(), self._default_tools()).tokens)
            if self.embedder.enabled and settings.recovery != "none":
                self.thread.submit(self.embedder.warm, priority=BACKGROUND)
        cells = shared + settings.slots * max(0, settings.budget_tokens - shared) + 2 * settings.block_tokens
        if settings.recovery != "none" and cells > rt.n_ctx:
            self._emit(EngineEvent("error", f"{settings.slots} slots of {settings.budget_tokens} tokens may not fit "
                                            f"in a context of {rt.n_ctx}; raise n_ctx or lower slots or budget"))
        info = self._info = rt.info()
        self._emit(EngineEvent("model_loaded", f"{info.name} on {info.device}"))
        return info

    def model_info(self) -> ModelInfo:
        self.ready.result()
        return self._info

    @property
    def model_loaded(self) -> bool:
        return self.rt is not None

    def _ensure_model(self) -> None:
        if self.rt is None:
            self._load(self.settings)

    def _unload(self) -> None:
        """Persist every open conversation, then free the model and its context (VRAM)."""
        if self.rt is None:
            return
        for state in list(self._states.values()):
            self._release(state)
        self.pool.close()
        self.prefixes.clear()
        self.rt.close()
        self.rt = None
        self._emit(EngineEvent("model_unloaded", "model unloaded after idle; it comes back on the next message"))

    def apply_settings(self, new: Settings) -> list[str]:
        """Adopt the settings that apply now (the budget reaches open conversations at once) and
        return the names that need `reload` to take effect."""
        new.validate()
        pending = new.needs_reload(self.settings)

        def apply() -> None:
            old = dataclasses.replace(self.settings)
            for name in live_settings.now_fields():
                setattr(self.settings, name, getattr(new, name))
            live_settings.push(self, old, [state.memory for state in self._states.values()])
            for state in self._states.values():
                self._refresh(state)

        self.thread.call(apply, priority=FOREGROUND)
        return pending

    def _switch_embedder(self) -> None:
        """Vectors of the old embedder mean nothing to the new one: open conversations drop theirs (recomputed
        when a decision needs them) and get their task focus recomputed; saved files are adapted on open."""
        self.embedder = Embedder(self.settings.embedder)
        for state in self._states.values():
            focus = focus_from_history(self.history.messages(state.id), self.embedder, self.settings)
            state.memory.adopt_embedder(self.embedder, focus)
        if self.embedder.enabled and self.settings.recovery != "none":
            self.thread.submit(self.embedder.warm, priority=BACKGROUND)

    def settings_in_use(self, conversation_id: str) -> dict:
        """Each "applies now" setting as the object that uses it holds it (tests, diagnostics)."""
        return self.thread.call(lambda: live_settings.in_use(self, self._open_state(conversation_id).memory),
                                priority=FOREGROUND)

    def reload(self, new: Settings) -> Future:
        """Load the model `new` names; on failure the previous model is loaded back and the error raised."""
        new = dataclasses.replace(new)

        def swap() -> ModelInfo:
            old = self.settings
            self._unload()
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

    def unload_model(self) -> None:
        self.thread.call(self._unload)

    def wait_idle(self) -> None:
        """Block until every job queued so far, background ones included, has run."""
        self.thread.call(lambda: None, priority=BACKGROUND + 1)

    def _default_system_prompt(self) -> str:
        return self.settings.system_prompt if self.settings.system_prompt is not None else default_system_prompt()

    def _default_tools(self) -> list[dict]:
        return default_tools() if self.settings.tools_enabled else []

    # -- prefixes and slots (engine thread) ------------------------------------------------
    def _prefix_for(self, system_prompt: str, tools: list[dict]) -> Prefix:
        rt = self.rt
        extra = tools_text(tools)
        segment = self.template.segment([], system_message(system_prompt, tools))
        split = segment.find(extra) if extra else -1
        texts = [("system", segment)] if split < 0 else [("system", segment[:split]), ("tools", segment[split:])]
        texts = [(name, text) for name, text in texts if text]
        pieces = [(name, text, rt.tokenize(text, add_special=(i == 0))) for i, (name, text) in enumerate(texts)]
        tokens = [t for _, _, toks in pieces for t in toks]
        key = prefix_key(tokens)
        prefix = self.prefixes.get(key)
        if prefix is None:
            seq, displaced = self.prefixes.free_seq()
            self.kv.drop(seq)
            if tokens:
                rt.decode(tokens, seq, 0, logits_last=False)
            prefix = Prefix(key=key, seq=seq, tokens=tokens, pieces=pieces)
            self.prefixes.add(prefix)
            if displaced is not None:
                log.info("prefix %s displaced by %s", displaced.key, key)
        return prefix

    def _ensure_slot(self, state: ConversationState, keep: str | None = None) -> None:
        """Put the conversation in a slot, parking the least recently used other one (never `keep`)."""
        memory = state.memory
        if memory.seq is not None:
            self.slots.touch(state.id)
            return
        slot = self.slots.free_slot()
        if slot is None:
            oldest = self.slots.least_recent(exclude=keep)
            self._states[oldest].memory.park()
            slot = self.slots.release(oldest)
            self._emit(EngineEvent("parked", f"conversation left slot {slot}", conversation_id=oldest))
            self._refresh(self._states[oldest])
        self.slots.pin(state.id, slot)
        prefix = self._prefix_for(state.system_prompt, state.tools)
        state.prefix = prefix
        self.kv.drop(slot)
        if prefix.tokens:
            self.kv.share(prefix.seq, slot, 0, len(prefix.tokens))
        try:
            memory.unpark(slot)
        except RestoreError as exc:                 # its parked bytes are gone (a spill file deleted)
            self._rebuild_lost(state, exc)

    def _rebuild_lost(self, state: ConversationState, error: Exception) -> None:
        """The conversation's saved K/V could not come back: drop it and re-prefill from SQLite, in place."""
        log.warning("KV of %s lost (%s): rebuilt from history", state.id, error)
        state.memory.release()
        if self.slots.slot_of(state.id) is not None:
            self.slots.release(state.id)
        state.memory = self._new_state(state.id, state.title, state.system_prompt, state.tools,
                                       state.pinned).memory
        state.history = []
        self._emit(EngineEvent("kv_rebuilt", f"saved K/V lost ({error}): rebuilt from history",
                               conversation_id=state.id))
        self._rebuild_from_history(state, self._prefix_for(state.system_prompt, state.tools))

    @staticmethod
    def _add_prefix_blocks(state: ConversationState, prefix: Prefix) -> None:
        for name, text, tokens in prefix.pieces:
            state.memory.table.append(Block(name=name, role=name, turn=0, tokens=list(tokens), text=text,
                                            shared=True))

    def _refresh(self, state: ConversationState) -> None:
        self._snapshots[state.id] = state.memory.stats()

    # -- conversations ----------------------------------------------------------------------
    def new_conversation(self, system_prompt: str | None = None, tools: list[dict] | None = None,
                         title: str | None = None, source: str | None = None) -> Conversation:
        self.ready.result()
        conversation_id = uuid.uuid4().hex
        system_prompt = self._default_system_prompt() if system_prompt is None else system_prompt
        tools = self._default_tools() if tools is None else tools
        state = self.thread.call(self._create_state, conversation_id, title or "New conversation",
                                 system_prompt, tools, source)
        return Conversation(self, state.id)

    def _create_state(self, conversation_id: str, title: str, system_prompt: str,
                      tools: list[dict], source: str | None = None) -> ConversationState:
        self._ensure_model()
        state = self._new_state(conversation_id, title, system_prompt, tools, pinned=False)
        prefix = self._prefix_for(system_prompt, tools)
        if len(prefix.tokens) >= self.settings.budget_tokens and self.settings.recovery != "none":
            raise BudgetError(f"the budget ({self.settings.budget_tokens} tokens) is not larger than the "
                              f"system prompt and tools ({len(prefix.tokens)} tokens)")
        self.history.create_conversation(conversation_id, title, system_prompt,
                                         settings={"tools": tools, **({"source": source} if source else {})})
        self._add_prefix_blocks(state, prefix)
        self._states[conversation_id] = state
        self._ensure_slot(state)
        state.last_used = self.clock()
        self._refresh(state)
        return state

    def _new_state(self, conversation_id: str, title: str, system_prompt: str, tools: list[dict],
                   pinned: bool) -> ConversationState:
        memory = ConversationMemory(conversation_id, settings=self.settings, runtime=self.rt, kv=self.kv,
                                    pool=self.pool, embedder=self.embedder, emit=self._emit)
        return ConversationState(id=conversation_id, title=title, system_prompt=system_prompt, tools=tools,
                                 memory=memory, pinned=pinned)

    def _open_state(self, conversation_id: str) -> ConversationState:
        """The open state of a conversation: in memory, else from its KV file, else rebuilt from history."""
        self._ensure_model()
        state = self._states.get(conversation_id)
        if state is not None:
            return state
        row = self.history.get_conversation(conversation_id)
        if row is None:
            raise KeyError(f"no conversation {conversation_id}")
        tools = row.settings.get("tools", []) if isinstance(row.settings, dict) else []
        state = self._new_state(row.id, row.title, row.system_prompt, tools, row.pinned)
        prefix = self._prefix_for(state.system_prompt, state.tools)
        if not self._restore_from_file(state, prefix):
            self._rebuild_from_history(state, prefix)
        state.last_used = self.clock()
        self._refresh(state)
        return state

    def _restore_from_file(self, state: ConversationState, prefix: Prefix) -> bool:
        """Adopt the conversation's KV file if the whole of it checks out and fits (`snapshot_check`,
        `snapshot_fit`); else remove the file, say why in one `kv_rebuilt` event and return False.
        Only a restore that worked refreshes the file's time, so an unusable file still expires."""
        had_file = self.kvfiles.has(state.id)
        payload = self.kvfiles.read(state.id, refresh=False)
        if payload is None:
            if had_file:
                self._emit(EngineEvent("kv_rebuilt", "cache file unusable (corrupt, expired or of another "
                                       "model): rebuilt from history", conversation_id=state.id))
            return False
        try:
            snapshot = decode_payload(payload)
            notes = fit_snapshot(snapshot, conversation_id=state.id, prefix_key=prefix.key,
                                 prefix_tokens=prefix.tokens, messages=self.history.messages(state.id),
                                 n_layer=self._info.n_layer, n_vocab=self.rt.n_vocab, geometry=self.kv.geometry,
                                 embedder=self.embedder, settings=self.settings)
        except SnapshotError as exc:
            return self._reject_file(state, f"cache file rejected ({exc})")
        try:
            state.memory.load_snapshot(snapshot, len(prefix.tokens))
            state.history = snapshot.history
            number_turns(state.history)
            self._states[state.id] = state
            self._ensure_slot(state)
            state.memory.check()
        except Exception as exc:  # noqa: BLE001 - checked yet unusable is a bug to log, and still only a cache
            log.exception("KV file of %s passed its checks but did not apply", state.id)
            self._states.pop(state.id, None)
            if state.memory.seq is not None:
                self.slots.release(state.id)
            state.memory.release()
            state.memory = self._new_state(state.id, state.title, state.system_prompt, state.tools,
                                           state.pinned).memory
            state.history = []
            return self._reject_file(state, f"cache file did not apply ({exc})")
        self.kvfiles.touch(state.id)
        extra = f" ({'; '.join(notes)})" if notes else ""
        self._emit(EngineEvent("kv_restored", f"restored {state.memory.active_tokens} tokens from disk{extra}",
                               conversation_id=state.id, tokens=state.memory.active_tokens))
        return True

    def _reject_file(self, state: ConversationState, reason: str) -> bool:
        log.warning("KV file of %s: %s", state.id, reason)
        self.kvfiles.remove(state.id)
        self._emit(EngineEvent("kv_rebuilt", f"{reason}: rebuilt from history", conversation_id=state.id))
        return False

    def _rebuild_from_history(self, state: ConversationState, prefix: Prefix) -> None:
        """Re-prefill the conversation from SQLite (the source of truth)."""
        self._add_prefix_blocks(state, prefix)
        self._states[state.id] = state
        self._ensure_slot(state)
        system = state.system_message
        for message in self.history.messages(state.id):
            if message.role == "assistant":
                replay_reply(state.memory, self.rt, self.template, state.history, message.text, system=system)
            else:
                replay_input(state.memory, self.rt, self.template, state.history, message.text,
                             message.attachments, system=system, role=message.role, extra=message.extra)
        if state.history and state.history[-1]["role"] != "assistant":
            state.memory.end_turn()

    def _persist(self, state: ConversationState, ttl_class: str | None = None) -> bool:
        """Write the conversation's KV file; a failure is reported and loses nothing (SQLite has the text)."""
        if not state.history:
            return False
        try:
            payload = encode_payload(state.memory.snapshot(state.prefix.key, state.history))
            self.kvfiles.write(state.id, ttl_class or state.ttl_class, payload)
        except StoreError as exc:
            self._emit(EngineEvent("error", f"could not save the KV cache: {exc}", conversation_id=state.id))
            return False
        self._emit(EngineEvent("kv_persisted", f"saved {len(payload) >> 20} MiB ({ttl_class or state.ttl_class})",
                               conversation_id=state.id, tokens=state.memory.active_tokens))
        return True

    def _release(self, state: ConversationState, persist: bool = True) -> None:
        """Persist (optionally) and drop a conversation from the context, the pool and memory."""
        if persist:
            self._persist(state)
        if state.memory.seq is not None:
            self.slots.release(state.id)
        state.memory.release()
        self._states.pop(state.id, None)
        snapshot = self._snapshots.get(state.id)
        if snapshot is not None:
            snapshot["memory"] = "disk" if self.kvfiles.has(state.id) else "none"

    def open_conversation(self, conversation_id: str) -> Conversation:
        self.thread.call(self._open_state, conversation_id, priority=FOREGROUND)
        return Conversation(self, conversation_id)

    def persist(self, conversation_id: str, ttl_class: str | None = None) -> bool:
        return self.thread.call(lambda: self._persist(self._open_state(conversation_id), ttl_class))

    def release_conversation(self, conversation_id: str, persist: bool = True) -> None:
        """Persist a conversation (unless told not to) and free its slot and RAM."""
        def release() -> None:
            state = self._states.get(conversation_id)
            if state is not None:
                self._release(state, persist=persist)
        self.thread.call(release)

    def conversations(self) -> list[ConversationInfo]:
        rows = self.history.list_conversations()
        out = []
        for row in rows:
            memory = self._snapshots.get(row.id, {}).get("memory")
            if memory is None:
                memory = "disk" if self.kvfiles is not None and self.kvfiles.has(row.id) else "none"
            parent = row.settings.get("forked_from") if isinstance(row.settings, dict) else None
            source = row.settings.get("source", "app") if isinstance(row.settings, dict) else "app"
            out.append(ConversationInfo(row.id, row.title, row.updated_at, row.pinned, memory,
                                        forked_from=parent if isinstance(parent, str) else None, source=source))
        return out

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        def rename() -> None:
            self.history.rename(conversation_id, title)
            state = self._states.get(conversation_id)
            if state is not None:
                state.title = title
        self.thread.call(rename, priority=FOREGROUND)

    def pin_conversation(self, conversation_id: str, pinned: bool) -> None:
        def pin() -> None:
            self.history.set_pinned(conversation_id, pinned)
            state = self._states.get(conversation_id)
            if state is not None:
                state.pinned = pinned
        self.thread.call(pin, priority=FOREGROUND)

    def delete_conversation(self, conversation_id: str) -> None:
        self.thread.call(self._forget, conversation_id)
        self.history.delete(conversation_id)

    def _forget(self, conversation_id: str) -> None:
        state = self._states.get(conversation_id)
        if state is not None:
            self._release(state, persist=False)
        self._snapshots.pop(conversation_id, None)
        if self.kvfiles is not None:
            self.kvfiles.remove(conversation_id)

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for `text` (special tokens parsed); loads the model if it was unloaded."""
        def run() -> list[int]:
            self._ensure_model()
            return self.rt.tokenize(text)
        return self.thread.call(run, priority=FOREGROUND)

    def focus(self, conversation_id: str | None) -> None:
        """Requests of the focused conversation are served before the others."""
        self.focused = conversation_id

    # -- turns ------------------------------------------------------------------------------
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
        Any failure but a cancel rolls the turn back: history, SQLite and KV as before it began."""
        self.last_activity = self.clock()
        state = self._open_state(conversation_id)
        self._ensure_slot(state)
        replaced, superseded = None, []
        if edit_index is not None:
            replaced, superseded = editing.rewind_for_edit(self, state, edit_index)
            state = self._states[conversation_id]
            if attachments is None:
                attachments = replaced.attachments
        attachments = list(attachments or [])
        n_before = len(state.history)
        user_row = self.history.add_message(state.id, role, text, attachments, extra=extra,
                                            previous_id=replaced.id if replaced else None)

        def progress(done: int, total: int) -> None:
            if total > self.settings.block_tokens * 2:
                self._emit(EngineEvent("prefill", f"{done}/{total}", conversation_id=state.id, tokens=done))

        try:
            reply = run_turn(state.memory, self.rt, self.template, state.history, text, attachments, params,
                             on_token, cancel, progress, system=state.system_message, role=role, extra=extra)
        except BaseException as exc:
            self._roll_back(state, n_before, user_row, superseded, exc)
            raise
        finally:
            self._refresh(state)
            state.last_used = self.last_activity = self.clock()
        self.history.add_message(state.id, "assistant", reply.text)
        self._emit(EngineEvent("turn_done", f"{reply.n_tokens} tokens, stopped: {reply.stopped}",
                               conversation_id=state.id, tokens=reply.n_tokens))
        return reply

    def _roll_back(self, state: ConversationState, n_before: int, user_row: int, superseded: list,
                   error: BaseException) -> None:
        """Undo a failed turn: its message leaves the live history (kept as deleted), an edit's old
        messages come back, and the KV returns to where it was (or is rebuilt from SQLite)."""
        self.history.hide_messages(state.id, [user_row], DELETED)
        if superseded:
            self.history.restore_messages(state.id, [r.id for r in superseded])
            editing.discard_state(self, state, f"the edit failed: {error}")
            return
        try:
            editing.truncate_state(self, state, n_before)
        except Exception as exc:  # noqa: BLE001
            editing.discard_state(self, state, f"the failed turn could not be undone: {exc}")
        self._emit(EngineEvent("error", f"the turn failed and was rolled back: {error}", conversation_id=state.id))

    def _regenerate(self, conversation_id: str, *, params: SamplingParams, on_token,
                    cancel: threading.Event) -> Reply:
        self.last_activity = self.clock()
        state = self._open_state(conversation_id)
        old = editing.rewind_for_regenerate(self, state)
        state = self._states[conversation_id]
        try:
            reply = regenerate_reply(state.memory, self.rt, self.template, state.history, params, on_token, cancel,
                                     system=state.system_message)
        except BaseException as exc:
            self.history.restore_messages(state.id, [old.id])
            editing.discard_state(self, state, f"the regenerate failed: {exc}")
            raise
        finally:
            self._refresh(state)
            state.last_used = self.last_activity = self.clock()
        self.history.add_message(state.id, "assistant", reply.text, previous_id=old.id)
        self._emit(EngineEvent("turn_done", f"regenerated: {reply.n_tokens} tokens, stopped: {reply.stopped}",
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

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
        if role not in ("user", "tool"):
            raise ValueError(f"a turn's input is a user or tool message, not {role!r}")
        return self.engine._submit_turn(self.id, self.engine._turn, on_token, sampling, text, list(attachments),
                                        role=role, extra=extra)

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

    def stats(self) -> dict:
        """The latest memory snapshot; never waits for the engine thread."""
        return dict(self.engine._snapshots.get(self.id, {}))

    def template_history(self) -> list[dict]:
        """A copy of the template messages (system excluded) the KV was built from (benches, tests)."""
        return self.engine.thread.call(lambda: [dict(m) for m in self.engine._open_state(self.id).history])

    def blocks(self, *, with_text: bool = False) -> list[dict]:
        """One summary per block (as in `stats()["blocks"]`), with each block's text when asked."""
        def read() -> list[dict]:
            table = self.engine._open_state(self.id).memory.table
            return [{**b.summary(), **({"text": b.text} if with_text else {})} for b in table.blocks]
        return self.engine.thread.call(read)

    def vector_dims(self) -> tuple[set[int], int | None]:
        """Dimensions of the block embeddings (computed where missing) and of the task focus (diagnostics)."""
        def read() -> tuple[set[int], int | None]:
            memory = self.engine._open_state(self.id).memory
            memory.ensure_embeddings(memory.table.blocks)
            dims = {b.embedding.shape[0] for b in memory.table.blocks if b.embedding is not None}
            return dims, None if memory.focus.vector is None else memory.focus.vector.shape[0]
        return self.engine.thread.call(read)

    def messages(self) -> list[dict]:
        return [{"role": m.role, "text": m.text, "attachments": m.attachments, "created_at": m.created_at,
                 "id": m.id, "extra": m.extra} for m in self.engine.history.messages(self.id)]

    def set_budget(self, tokens: int) -> None:
        def apply() -> None:
            state = self.engine._open_state(self.id)
            state.memory.set_budget(tokens)
            self.engine._refresh(state)

        self.engine.thread.call(apply, priority=FOREGROUND)

    def reset_focus(self) -> None:
        """A task boundary: the task focus forgets the earlier messages (EVOKE's `task_boundary`)."""
        def apply() -> None:
            self.engine._open_state(self.id).memory.focus.vector = None

        self.engine.thread.call(apply, priority=FOREGROUND)

    def pin_block(self, name: str, pinned: bool = True, priority: float | None = None) -> None:
        """Pin a block (never evicted) or change its priority multiplier (the harness knows best)."""
        def apply() -> None:
            state = self.engine._open_state(self.id)
            block = state.memory.table.by_name(name)
            if block is None:
                raise KeyError(f"no block {name!r} in this conversation")
            block.pinned = pinned
            if priority is not None:
                block.priority = priority
            self.engine._refresh(state)

        self.engine.thread.call(apply, priority=FOREGROUND)

    def check(self) -> None:
        """Assert the block table mirrors llama.cpp's sequence (tests)."""
        self.engine.thread.call(lambda: self.engine._open_state(self.id).memory.check())
