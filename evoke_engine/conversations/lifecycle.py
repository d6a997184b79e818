"""The open conversations' lifecycle on the engine thread: create, slot, restore, rebuild, persist, release.

Invariants: an open conversation is in `states` exactly while its memory may hold cells or pool bytes;
SQLite is the source of truth (a KV file is adopted only whole and checked, its history equal to or a
prefix of SQLite's, the rest then decoded from history; else rebuilt from history, with `kv_rebuilding`
progress); `latest_stats` is the only state read from other threads (a frozen snapshot, replaced, never mutated).
Its collaborators are values: the history store, the loaded model (`attach`ed at load, `detach`ed at unload after
every conversation left it) and the KV files (which outlive the model); it never refers to the Engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import BudgetError, EngineBusyError, RebuildCancelled, RestoreError
from ..events import EngineEvent, EventKind
from ..kvcache.prefixes import Prefix, system_message
from ..kvcache.slots import touches
from ..memory.chunk_files import KVFileChunks
from ..memory.file_bits import pack_for_file, unpack_image
from ..memory.memory import ConversationMemory, require_budget
from ..memory.recovery import backend as recovery_backend
from ..memory.snapshot import SnapshotError, decode_payload, encode_payload
from ..runtime.rpc import RemoteDeviceLost
from ..stats import ConversationStats
from ..store.history import HistoryDB, MessageRow
from ..store.store_error import StoreError
from .snapshot_fit import fit_snapshot
from .turn import PreparedInput, number_turns, render_user_content, replay_input, replay_reply

if TYPE_CHECKING:
    from ..settings import Settings
    from ..store.kvfiles import KVFileStore
    from .loaded_model import LoadedModel

log = logging.getLogger(__name__)
OPENED_TOGETHER_S = 1.0    # conversations placed within this of each other are taken to stream together
WINDOW_OWNER = "window"          # the owner, for chunk reuse, of every conversation the endpoint did not make
REUSE_OWNER = "owner"            # the settings key where the endpoint stores a conversation's client (`reuse_owner`)


def owner_of(conversation_id: str, settings: dict) -> str:
    """The owner a conversation's stored settings name: an endpoint conversation's client (`api:` its `owner`; one
    without is an owner alone), else the window."""
    if settings.get("source") != "api":
        return WINDOW_OWNER
    owner = settings.get(REUSE_OWNER)
    return f"api:{owner}" if isinstance(owner, str) and owner else f"conversation:{conversation_id}"


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
    ahead: PreparedInput | None = None     # the next input, prepared while it was typed (`TurnJobs.prepare_ahead`)

    @property
    def ttl_class(self) -> str:
        return "extended" if self.pinned else "long"

    @property
    def system_message(self) -> dict:
        return system_message(self.system_prompt, self.tools)


class ConversationLifecycle:
    """The open conversations of one engine; every method but `latest_stats` runs on the engine thread."""

    def __init__(self, history: HistoryDB, *, emit: Callable[[EngineEvent], None], clock: Callable[[], float],
                 ensure_model: Callable[[], LoadedModel]) -> None:
        self.history = history
        self.emit, self.clock = emit, clock
        self._ensure_model = ensure_model         # loads the model back after an idle unload (stamps activity)
        self.model: LoadedModel | None = None     # set exactly while the model is loaded
        self.files: KVFileStore | None = None     # the last loaded model's KV files (on disk: they outlive it)
        self._states: dict[str, ConversationState] = {}
        self._stats: dict[str, ConversationStats] = {}
        self._rebuilds: dict[str, tuple[int, float]] = {}    # tokens and seconds decoded from history, until taken
        self._reuse_owners: dict[str, str] = {}    # endpoint conversation id -> its owner, for chunk reuse
        self.streaming: Callable[[], set[str]] = set   # conversations whose reply streams: they keep their slot
        self._placed_last: str | None = None       # the conversation put in a slot last (slots go next to it
        self._placed_at = 0.0                      # while it is recent: `OPENED_TOGETHER_S`)

    # -- the model ---------------------------------------------------------------------------
    def attach(self, model: LoadedModel) -> None:
        """The model was loaded: conversations open in it from now on."""
        self.model, self.files = model, model.files
        model.chunks.owner_of = self.reuse_owner

    def reuse_owner(self, conversation_id: str) -> str:
        """Whose a conversation is, for chunk reuse and its shared prefix (any thread): an endpoint conversation's
        client (the `owner` the endpoint stores in its settings; one without is an owner alone), else the window's."""
        known = self._reuse_owners.get(conversation_id)
        if known is not None:
            return known
        row = self.history.get_conversation(conversation_id)
        settings = row.settings if row is not None and isinstance(row.settings, dict) else {}
        owner = owner_of(conversation_id, settings)
        if owner.startswith("api:"):
            self._reuse_owners[conversation_id] = owner     # set once, never changed
        return owner                 # the window's is not kept: the endpoint may mark its conversations later

    def detach(self) -> None:
        """Every open conversation leaves the model (persisted), which is about to be closed."""
        self.release_all()
        self.model = None

    # -- lookup -----------------------------------------------------------------------------
    def open_states(self) -> list[ConversationState]:
        return list(self._states.values())

    def get(self, conversation_id: str) -> ConversationState | None:
        """The state of a conversation that is open now (None when it is not: nothing is loaded)."""
        return self._states.get(conversation_id)

    def latest_stats(self, conversation_id: str) -> ConversationStats | None:
        """The memory snapshot taken at the conversation's last change (any thread)."""
        return self._stats.get(conversation_id)

    def refresh(self, state: ConversationState) -> None:
        self._stats[state.id] = state.memory.stats()

    def take_rebuild(self, conversation_id: str) -> tuple[int, float]:
        """(tokens, seconds) decoded from history for the conversation since the last call (a turn's cost)."""
        return self._rebuilds.pop(conversation_id, (0, 0.0))

    def adopt_settings(self, old: Settings, new: Settings) -> None:
        """The settings changed (a `SettingsHub` subscriber): each open conversation's memory adopts them; one
        that refuses (a budget below its own minimum) keeps no other behind, and its error is raised after."""
        error: BudgetError | None = None
        for state in self.open_states():
            try:
                state.memory.adopt_settings(old, new)
            except BudgetError as exc:
                error = error or exc
            self.refresh(state)
        if error is not None:
            raise error

    def rename(self, conversation_id: str, title: str) -> None:
        self.history.rename(conversation_id, title)
        state = self._states.get(conversation_id)
        if state is not None:
            state.title = title

    def set_pinned(self, conversation_id: str, pinned: bool) -> None:
        """Pin or unpin (a pinned conversation's KV file has the extended TTL from its next write)."""
        self.history.set_pinned(conversation_id, pinned)
        state = self._states.get(conversation_id)
        if state is not None:
            state.pinned = pinned

    # -- opening ----------------------------------------------------------------------------
    def fresh_state(self, conversation_id: str, title: str, system_prompt: str, tools: list[dict],
                    pinned: bool = False) -> ConversationState:
        """A state with an empty memory, not yet open (no blocks, no slot)."""
        model = self.model
        memory = ConversationMemory(conversation_id, settings=model.settings, runtime=model.rt, kv=model.kv,
                                    pool=model.pool, embedder=model.embedder, emit=self.emit, chunks=model.chunks)
        return ConversationState(id=conversation_id, title=title, system_prompt=system_prompt, tools=tools,
                                 memory=memory, pinned=pinned)

    def adopt(self, state: ConversationState, prefix: Prefix) -> None:
        """Open a fresh state: its memory gets the prefix blocks and it joins the open conversations."""
        state.memory.adopt_prefix(prefix.blocks())
        self._states[state.id] = state

    def create(self, conversation_id: str, title: str, system_prompt: str, tools: list[dict],
               source: str | None = None, owner: str | None = None) -> ConversationState:
        """A new conversation: its SQLite row (with its `owner`, an endpoint client, when given), its prefix (that
        owner's, or a public one) shared into a slot."""
        model = self._ensure_model()
        state = self.fresh_state(conversation_id, title, system_prompt, tools)
        settings = {"tools": tools, **({"source": source} if source else {}), **({REUSE_OWNER: owner} if owner else {})}
        prefix = model.prefixes.for_conversation(system_prompt, tools, owner_of(conversation_id, settings))
        if recovery_backend(model.settings.recovery).evicts:
            require_budget(model.settings.budget_tokens, len(prefix.tokens), 0, model.settings)
        self.history.create_conversation(conversation_id, title, system_prompt, settings=settings)
        self.adopt(state, prefix)
        self.ensure_slot(state)
        state.last_used = self.clock()
        self.refresh(state)
        return state

    def open(self, conversation_id: str, cancel: threading.Event | None = None) -> ConversationState:
        """The open state of a conversation: in memory, else from its KV file, else rebuilt from history.

        `cancel`, once set, stops a rebuild between two prefill blocks: the conversation is left closed (no
        slot, no cells; its KV file, if any, kept) and `RebuildCancelled` is raised."""
        self._ensure_model()
        state = self._states.get(conversation_id)
        if state is not None:
            return state
        row = self.history.get_conversation(conversation_id)
        if row is None:
            raise KeyError(f"no conversation {conversation_id}")
        tools = row.settings.get("tools", []) if isinstance(row.settings, dict) else []
        state = self.fresh_state(row.id, row.title, row.system_prompt, tools, row.pinned)
        prefix = self.prefix_of(state)
        try:
            if not self._restore_from_file(state, prefix, cancel):
                self._rebuild_from_history(state, prefix, cancel)
        except RebuildCancelled:
            self._reset(state)
            self.emit(EngineEvent(EventKind.KV_REBUILDING, "rebuild from history cancelled", conversation_id=state.id,
                                  detail={"done": 0, "total": 0, "cancelled": True}))
            raise
        state.last_used = self.clock()
        self.refresh(state)
        return state

    def prefix_of(self, state: ConversationState) -> Prefix:
        """The shared prefix the conversation gets: its owner's (`reuse_owner`), or a public one (the prewarmed
        default prompt and tools), decoded now when neither holds it."""
        return self.model.prefixes.for_conversation(state.system_prompt, state.tools, self.reuse_owner(state.id))

    # -- slots ------------------------------------------------------------------------------
    def ensure_slot(self, state: ConversationState, keep: str | None = None) -> None:
        """Put the conversation in a slot, parking the least recently used other one (never `keep`). Where a step
        decodes each run of consecutive slots as a pass of its own (`slot_runs_batch`), the slot goes next to the
        streaming replies' and the one placed last within `OPENED_TOGETHER_S` (requests arriving together start
        together; a user switching conversations by hand is slower, and gets the least recently used victim): a free
        one there, else an idle neighbour's there, parked (no recompute; a free slot apart from the streaming replies
        is not taken then)."""
        model = self.model
        memory = state.memory
        if memory.seq is not None:
            model.slots.touch(state.id)
            return
        streaming = self.streaming()
        streaming_slots = {model.slots.slot_of(c) for c in streaming} - {None}
        placed_last = (model.slots.slot_of(self._placed_last)
                       if self._placed_last and self.clock() - self._placed_at <= OPENED_TOGETHER_S else None)
        beside = streaming_slots | ({placed_last} if placed_last is not None else set())
        slot = model.slots.free_slot(beside=beside)
        victim = None
        if model.rt.slot_runs_batch and (slot is None or (streaming_slots and not touches(slot, streaming_slots))):
            # a reply in a run of its own costs every step a pass over the weights (6 ms in 33, four replies here)
            victim = model.slots.least_recent(exclude={keep, *streaming, self._placed_last},    # not the one
                                              touching=beside if slot is None else streaming_slots)   # to stand by
        if slot is None and victim is None:
            victim = model.slots.least_recent(exclude={keep, *streaming})
            if victim is None:
                raise EngineBusyError("every slot holds a reply being written; this conversation opens when one "
                                      "of them ends")
        if victim is not None:
            slot = self._leave_slot(self._states[victim], park=True)
            self.emit(EngineEvent(EventKind.PARKED, f"conversation left slot {slot}", conversation_id=victim))
            self.refresh(self._states[victim])
        model.slots.pin(state.id, slot)
        self._placed_last, self._placed_at = state.id, self.clock()
        prefix = self.prefix_of(state)
        state.prefix = prefix
        try:
            memory.enter_slot(slot, model.prefixes, prefix)
        except RestoreError as exc:                 # its parked bytes are gone (a spill file deleted)
            self._rebuild_lost(state, exc)

    def _leave_slot(self, state: ConversationState, *, park: bool) -> int | None:
        """The conversation leaves its slot, in the registry and its memory together (the one place that
        does both): parked (its cells saved as an image) or released (every byte forgotten, the pool's too).
        Returns the slot it left (None: it held none)."""
        slot = self.model.slots.slot_of(state.id)
        if park:
            state.memory.park()
        else:
            state.memory.release()
        if slot is not None:
            self.model.slots.release(state.id)
        return slot

    def _reset(self, state: ConversationState) -> None:
        """Out of its slot and the pool, with a fresh empty memory and no history (not open)."""
        self._states.pop(state.id, None)
        self._leave_slot(state, park=False)
        state.memory = self.fresh_state(state.id, state.title, state.system_prompt, state.tools,
                                        state.pinned).memory
        state.history = []

    def _rebuild_lost(self, state: ConversationState, error: Exception) -> None:
        """The conversation's saved K/V could not come back: drop it and re-prefill from SQLite, in place."""
        log.warning("KV of %s lost (%s): rebuilt from history", state.id, error)
        self._reset(state)
        self.emit(EngineEvent(EventKind.KV_REBUILT, f"saved K/V lost ({error}): rebuilt from history",
                                     conversation_id=state.id))
        self._rebuild_from_history(state, self.prefix_of(state))

    # -- restore and rebuild ----------------------------------------------------------------
    def _restore_from_file(self, state: ConversationState, prefix: Prefix,
                           cancel: threading.Event | None = None) -> bool:
        """Adopt the conversation's KV file if the whole of it checks out and fits (`snapshot_check`,
        `snapshot_fit`) and its history is SQLite's or a prefix of it (a file written before the last
        messages, e.g. before a crash): those later messages are then decoded from history. Else remove the
        file, say why in one `kv_rebuilt` event and return False. Only a restore that worked refreshes the
        file's time, so an unusable file still expires."""
        model = self.model
        had_file = self.files.has(state.id)
        payload = self.files.read(state.id, refresh=False)
        if payload is None:
            if had_file:
                self.emit(EngineEvent(EventKind.KV_REBUILT, "cache file unusable (corrupt, expired or of another "
                                     "model): rebuilt from history", conversation_id=state.id))
            return False
        messages = self.history.messages(state.id)
        try:
            snapshot = unpack_image(decode_payload(payload))     # an 8-bit file's image back at full width
            known = len(snapshot.history)
            if known > len(messages):
                raise SnapshotError(f"it holds {known} messages, the saved chat {len(messages)}")
            notes = fit_snapshot(snapshot, conversation_id=state.id, prefix_key=prefix.key,
                                 prefix_tokens=prefix.tokens, messages=messages[:known],
                                 n_layer=model.info.n_layer, n_vocab=model.rt.n_vocab,
                                 geometry=model.kv.geometry, embedder=model.embedder, settings=model.settings)
        except SnapshotError as exc:
            return self._reject_file(state, f"cache file rejected ({exc})")
        try:
            state.memory.load_snapshot(snapshot, len(prefix.tokens))
            state.history = snapshot.history
            number_turns(state.history)
            self._states[state.id] = state
            self.ensure_slot(state)
            state.memory.check()
        except Exception as exc:  # noqa: BLE001 - checked yet unusable is a bug to log, and still only a cache
            log.exception("KV file of %s passed its checks but did not apply", state.id)
            self._reset(state)
            return self._reject_file(state, f"cache file did not apply ({exc})")
        restored = state.memory.active_tokens
        tail = messages[known:]
        if tail:
            try:
                self._replay(state, tail, "the messages after the cache file", cancel)
                state.memory.check()
            except RebuildCancelled:
                raise                                   # the file stays: it was good
            except Exception as exc:  # noqa: BLE001 - the file was good; its continuation was not: start over
                log.exception("the messages after the KV file of %s did not replay", state.id)
                self._reset(state)
                return self._reject_file(state, f"the messages after the cache file did not replay ({exc})")
            notes = [*notes, f"{len(tail)} later messages decoded from history"]
        self.files.touch(state.id)
        extra = f" ({'; '.join(notes)})" if notes else ""
        self.emit(EngineEvent(EventKind.KV_RESTORED, f"restored {restored} tokens from disk{extra}",
                             conversation_id=state.id, tokens=restored))
        return True

    def _remove_file(self, conversation_id: str) -> None:
        """Delete the conversation's KV file; the chunk index stops offering its blocks."""
        if self.model is not None:
            self.model.chunks.forget_file(conversation_id)
        if self.files is not None:
            self.files.remove(conversation_id)

    def _reject_file(self, state: ConversationState, reason: str) -> bool:
        log.warning("KV file of %s: %s", state.id, reason)
        self._remove_file(state.id)
        self.emit(EngineEvent(EventKind.KV_REBUILT, f"{reason}: rebuilt from history", conversation_id=state.id))
        return False

    def _rebuild_from_history(self, state: ConversationState, prefix: Prefix,
                              cancel: threading.Event | None = None) -> None:
        """Re-prefill the conversation from SQLite (the source of truth)."""
        self.adopt(state, prefix)
        self.ensure_slot(state)
        messages = self.history.messages(state.id)
        if messages:
            self._replay(state, messages, "the conversation", cancel)

    def _replay(self, state: ConversationState, messages: Sequence[MessageRow], what: str,
                cancel: threading.Event | None = None) -> int:
        """Decode `messages` (SQLite rows) at the end of the open conversation's KV, emitting `kv_rebuilding`
        progress (done/total tokens; total is an estimate until the last event, where done == total) and
        refreshing its stats as blocks land. The tokens and seconds are kept for `take_rebuild`. A set `cancel`
        raises `RebuildCancelled` before the next block (the caller drops the half-built state)."""
        model = self.model
        memory, system = state.memory, state.system_message
        texts = [m.text if m.role == "assistant" else render_user_content(m.text, m.attachments) for m in messages]
        total = sum(len(model.rt.tokenize(text)) + 5 for text in texts)    # + the template's few tokens around each
        first = memory.prefilled_tokens
        started = time.perf_counter()

        def progress(done: int, final: bool = False) -> None:
            self.refresh(state)
            shown = done if final else max(total, done)
            self.emit(EngineEvent(EventKind.KV_REBUILDING, f"rebuilding {what} from history: {done}/{shown} tokens",
                                 conversation_id=state.id, tokens=done,
                                 detail={"done": done, "total": shown, "messages": len(messages)}))

        def stop_if_cancelled() -> None:
            if cancel is not None and cancel.is_set():
                raise RebuildCancelled(f"rebuilding {what} from history was cancelled")

        def on_block(_block) -> None:
            progress(memory.prefilled_tokens - first)
            stop_if_cancelled()
            model.rt.step_boundary()        # in a stream (`Engine.begin_open`), replies take their steps here

        progress(0)
        for message in messages:
            stop_if_cancelled()
            if message.role == "assistant":
                replay_reply(memory, model.rt, model.template, state.history, message.text, system=system,
                             on_block=on_block)
            else:
                replay_input(memory, model.rt, model.template, state.history, message.text, message.attachments,
                             system=system, role=message.role, extra=message.extra, on_block=on_block)
        if state.history and state.history[-1]["role"] != "assistant":
            memory.end_turn()
        done = memory.prefilled_tokens - first
        tokens, seconds = self._rebuilds.get(state.id, (0, 0.0))
        self._rebuilds[state.id] = (tokens + done, seconds + time.perf_counter() - started)
        progress(done, final=True)
        return done

    # -- persist and release ----------------------------------------------------------------
    def persist(self, state: ConversationState, ttl_class: str | None = None) -> bool:
        """Write the conversation's KV file; a failure is reported and loses nothing (SQLite has the text)."""
        if not state.history:
            return False
        try:
            snapshot = pack_for_file(state.memory.snapshot(state.prefix.key, state.history),
                                     self.model.settings.kv_file_bits)
            payload = encode_payload(snapshot)
            self.files.write(state.id, ttl_class or state.ttl_class, payload)
        except (StoreError, RemoteDeviceLost) as exc:       # a lost worker's K/V cannot be read: SQLite has the text
            self.emit(EngineEvent(EventKind.ERROR, f"could not save the KV cache: {exc}", conversation_id=state.id))
            return False
        if self.model is not None and isinstance(self.model.chunks.files, KVFileChunks):
            self.model.chunks.files.written(self.model.chunks, snapshot)     # its exact blocks, reusable from disk
        said = f"saved {len(payload) >> 20} MiB ({ttl_class or state.ttl_class})"
        self.emit(EngineEvent(EventKind.KV_PERSISTED, said, conversation_id=state.id,
                              tokens=state.memory.active_tokens))
        return True

    def release(self, state: ConversationState, persist: bool = True) -> None:
        """Persist (optionally) and drop a conversation from the context, the pool and memory."""
        if persist:
            self.persist(state)
        self._leave_slot(state, park=False)
        self._states.pop(state.id, None)
        stats = self._stats.get(state.id)
        if stats is not None:
            self._stats[state.id] = dataclasses.replace(stats, memory="disk" if self.files.has(state.id) else "none")

    def release_all(self) -> None:
        for state in self.open_states():
            self.release(state)

    def forget(self, conversation_id: str) -> None:
        """The conversation is being deleted: no file, no cells, no snapshot remain."""
        state = self._states.get(conversation_id)
        if state is not None:
            self.release(state, persist=False)
        self._stats.pop(conversation_id, None)
        self._rebuilds.pop(conversation_id, None)
        self._reuse_owners.pop(conversation_id, None)
        self._remove_file(conversation_id)

    def discard(self, state: ConversationState, reason: str) -> None:
        """Forget the conversation's KV (slot, pool, file): the next use rebuilds it from SQLite."""
        self.release(state, persist=False)
        self._remove_file(state.id)
        self.emit(EngineEvent(EventKind.KV_REBUILT, f"cache dropped ({reason}): it is rebuilt from history",
                              conversation_id=state.id))
