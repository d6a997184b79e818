"""The Engine: one model, its conversations, slots and shared prefixes, behind one engine thread.

Invariants: every llama.cpp call runs on the engine thread (`EngineThread`); public methods
are safe from any thread and never hand out internal structures (snapshots and futures only);
SQLite history is written before a reply starts, so no user message is lost.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from .blocks import Block
from .embedder import Embedder
from .errors import BudgetError, EvokeError
from .events import EngineEvent
from .kv import KVCache
from .memory import ConversationMemory
from .pool import SavedPool
from .runtime import ModelInfo, Runtime
from .sampling import SamplingParams
from .settings import Settings
from .slots import Prefix, PrefixRegistry, SlotRegistry, prefix_key
from .store.history import HistoryDB
from .template import ChatTemplate
from .turn import Attachment, Reply, run_turn
from .worker import FOREGROUND, NORMAL, EngineThread

log = logging.getLogger(__name__)
RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def default_system_prompt() -> str:
    return (RESOURCES / "system_prompt.txt").read_text().strip()


def default_tools() -> list[dict]:
    return json.loads((RESOURCES / "tools.json").read_text())


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


@dataclass
class ConversationState:
    """Engine-thread state of one open conversation."""

    id: str
    title: str
    system_prompt: str
    tools: list[dict]
    memory: ConversationMemory
    history: list[dict] = field(default_factory=list)     # template messages
    cancel: threading.Event = field(default_factory=threading.Event)
    snapshot: dict = field(default_factory=dict)
    prefix: Prefix | None = None


class Engine:
    def __init__(self, settings: Settings | None = None, *, wait: bool = True, scheduler=None) -> None:
        self.settings = settings or Settings()
        self.thread = EngineThread()
        self._subscribers: list[Callable[[EngineEvent], None]] = []
        self._states: dict[str, ConversationState] = {}
        self._lock = threading.Lock()
        self.focused: str | None = None
        self.history = HistoryDB(self.settings.data_dir / "history.sqlite3")
        self.rt: Runtime | None = None
        self.ready: Future = self.thread.submit(self._load, self.settings, priority=FOREGROUND)
        self.scheduler = scheduler
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
        if not rt.eviction_supported:
            self._emit(EngineEvent("error", f"{rt.eviction_note}; chat works without eviction"))
        self._prefix_for(self._default_system_prompt(), self._default_tools())   # prewarm
        info = rt.info()
        self._emit(EngineEvent("model_loaded", f"{info.name} on {info.device}"))
        return info

    def model_info(self) -> ModelInfo:
        self.ready.result()
        return self.rt.info()

    def _default_system_prompt(self) -> str:
        return self.settings.system_prompt if self.settings.system_prompt is not None else default_system_prompt()

    def _default_tools(self) -> list[dict]:
        return default_tools() if self.settings.tools_enabled else []

    # -- prefixes and slots (engine thread) ------------------------------------------------
    def _prefix_for(self, system_prompt: str, tools: list[dict]) -> Prefix:
        rt = self.rt
        extra = tools_text(tools)
        segment = self.template.segment([], {"role": "system", "content": system_prompt + extra})
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

    def _ensure_slot(self, state: ConversationState) -> None:
        memory = state.memory
        if memory.seq is not None:
            self.slots.touch(state.id)
            return
        slot = self.slots.free_slot()
        if slot is None:
            oldest = self.slots.least_recent()
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
        if not memory.table.blocks:
            for name, text, tokens in prefix.pieces:
                memory.table.append(Block(name=name, role=name, turn=0, tokens=list(tokens), text=text,
                                          shared=True))
        memory.unpark(slot)

    def _refresh(self, state: ConversationState) -> None:
        state.snapshot = state.memory.stats()

    # -- conversations ----------------------------------------------------------------------
    def new_conversation(self, system_prompt: str | None = None, tools: list[dict] | None = None,
                         title: str | None = None) -> Conversation:
        self.ready.result()
        conversation_id = uuid.uuid4().hex
        system_prompt = self._default_system_prompt() if system_prompt is None else system_prompt
        tools = self._default_tools() if tools is None else tools
        state = self.thread.call(self._create_state, conversation_id, title or "New conversation",
                                 system_prompt, tools)
        return Conversation(self, state.id)

    def _create_state(self, conversation_id: str, title: str, system_prompt: str,
                      tools: list[dict]) -> ConversationState:
        memory = ConversationMemory(conversation_id, settings=self.settings, runtime=self.rt, kv=self.kv,
                                    pool=self.pool, embedder=self.embedder, emit=self._emit)
        state = ConversationState(id=conversation_id, title=title, system_prompt=system_prompt, tools=tools,
                                  memory=memory)
        prefix = self._prefix_for(system_prompt, tools)
        if len(prefix.tokens) >= self.settings.budget_tokens and self.settings.recovery != "none":
            raise BudgetError(f"the budget ({self.settings.budget_tokens} tokens) is not larger than the "
                              f"system prompt and tools ({len(prefix.tokens)} tokens)")
        self._states[conversation_id] = state
        self._ensure_slot(state)
        self.history.create_conversation(conversation_id, title, system_prompt,
                                         settings={"tools": [t["function"]["name"] for t in tools]})
        self._refresh(state)
        return state

    def conversations(self) -> list[ConversationInfo]:
        rows = self.history.list_conversations()
        out = []
        for row in rows:
            state = self._states.get(row.id)
            memory = state.snapshot.get("memory", "none") if state else "none"
            out.append(ConversationInfo(row.id, row.title, row.updated_at, row.pinned, memory))
        return out

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        self.history.rename(conversation_id, title)
        if conversation_id in self._states:
            self._states[conversation_id].title = title

    def pin_conversation(self, conversation_id: str, pinned: bool) -> None:
        self.history.set_pinned(conversation_id, pinned)

    def delete_conversation(self, conversation_id: str) -> None:
        self.thread.call(self._forget, conversation_id)
        self.history.delete(conversation_id)

    def _forget(self, conversation_id: str) -> None:
        state = self._states.pop(conversation_id, None)
        if state is None:
            return
        memory = state.memory
        if memory.seq is not None:
            self.kv.drop(memory.seq)
            self.slots.release(conversation_id)
        for block in memory.table.blocks + ([memory.image] if memory.image else []):
            self.pool.discard(block)

    def focus(self, conversation_id: str | None) -> None:
        """Requests of the focused conversation are served before the others."""
        self.focused = conversation_id

    # -- turns ------------------------------------------------------------------------------
    def _submit_turn(self, conversation_id: str, text: str, attachments: Sequence[Attachment],
                     on_token: Callable[[str], None] | None, sampling: dict) -> Future:
        params = SamplingParams.from_settings(self.settings, **sampling)
        state = self._states[conversation_id]
        state.cancel.clear()
        priority = FOREGROUND if conversation_id == self.focused else NORMAL
        return self.thread.submit(self._turn, state, text, list(attachments), params, on_token,
                                  priority=priority)

    def _turn(self, state: ConversationState, text: str, attachments: list[Attachment],
              params: SamplingParams, on_token) -> Reply:
        self._ensure_slot(state)
        self.history.add_message(state.id, "user", text, attachments)

        def progress(done: int, total: int) -> None:
            if total > self.settings.block_tokens * 2:
                self._emit(EngineEvent("prefill", f"{done}/{total}", conversation_id=state.id, tokens=done))

        try:
            reply = run_turn(state.memory, self.rt, self.template, state.history, text, attachments, params,
                             on_token, state.cancel, progress)
        finally:
            self._refresh(state)
        self.history.add_message(state.id, "assistant", reply.text)
        self._emit(EngineEvent("turn_done", f"{reply.n_tokens} tokens, stopped: {reply.stopped}",
                               conversation_id=state.id, tokens=reply.n_tokens))
        return reply

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True

        def shutdown() -> None:
            if self.rt is not None:
                self.pool.close()
                self.rt.close()
                self.rt = None

        try:
            self.thread.call(shutdown)
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
    def _state(self) -> ConversationState:
        return self.engine._states[self.id]

    @property
    def title(self) -> str:
        return self._state.title

    def submit(self, text: str, attachments: Sequence[Attachment] = (), *,
               on_token: Callable[[str], None] | None = None, **sampling) -> Future:
        """Start a turn; the Future gives the Reply. `on_token` runs on the engine thread."""
        return self.engine._submit_turn(self.id, text, attachments, on_token, sampling)

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
        self._state.cancel.set()

    def stats(self) -> dict:
        return dict(self._state.snapshot)

    def messages(self) -> list[dict]:
        return [{"role": m.role, "text": m.text, "attachments": m.attachments, "created_at": m.created_at}
                for m in self.engine.history.messages(self.id)]

    def set_budget(self, tokens: int) -> None:
        state = self._state

        def apply() -> None:
            state.memory.set_budget(tokens)
            self.engine._refresh(state)

        self.engine.thread.call(apply, priority=FOREGROUND)

    def check(self) -> None:
        """Assert the block table mirrors llama.cpp's sequence (tests)."""
        self.engine.thread.call(self._state.memory.check)
