"""One loaded model as one value: its runtime, KV primitives, chat template, shared prefixes, host pool, slots,
KV files, attention capture and embedder. The runtime, KV primitives and sampler come from a `Backend`
(llama.cpp by default; a simulated one runs a whole Engine without a model).

Invariants: a `LoadedModel` exists exactly while the model is loaded (the Engine holds one or None); `load`
either returns a whole value or frees what it made and raises; `close` frees everything in one place, in
dependency order (pool, prefixes, contexts, then the capture they called into), and a second call does
nothing. The KV files are on disk and outlive the value (the store holds no context). Its pool follows the
settings it uses through `SettingsHub` subscriptions, cancelled by `close`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..events import EngineEvent, EventKind
from ..kvcache.chunk_index import ChunkIndex
from ..kvcache.pool import SavedPool
from ..kvcache.prefixes import SharedPrefixes
from ..kvcache.slots import SlotRegistry
from ..memory.chunk_files import KVFileChunks
from ..memory.embedder import Embedder
from ..runtime.attention import AttentionCapture
from ..runtime.backend import LLAMA_CPP, Backend, BackendParts
from ..runtime.kv import KVPrimitives
from ..runtime.runtime import ModelInfo, Runtime
from ..runtime.template import ChatTemplate
from ..settings import TTL_SETTINGS, Settings
from ..settings_hub import SettingsHub, Subscription
from ..store.kvfiles import KVFileStore, model_hash

log = logging.getLogger(__name__)


@dataclass(eq=False)
class LoadedModel:
    hub: SettingsHub                # the engine's settings: `settings` is its current value
    rt: Runtime                     # or a simulated runtime with its public surface (`Backend`)
    kv: KVPrimitives
    template: ChatTemplate
    prefixes: SharedPrefixes
    pool: SavedPool
    slots: SlotRegistry
    files: KVFileStore
    attention: AttentionCapture | None
    embedder: Embedder              # replaced by `Engine.switch_embedder` only
    info: ModelInfo
    subscriptions: list[Subscription] = field(default_factory=list)
    chunks: ChunkIndex = field(default_factory=ChunkIndex)   # decoded chunks of open conversations and KV files
    closed: bool = False

    @property
    def settings(self) -> Settings:
        """The settings now (an immutable snapshot)."""
        return self.hub.current

    @classmethod
    def load(cls, hub: SettingsHub, emit: Callable[[EngineEvent], None], clock: Callable[[], float],
             backend: Backend = LLAMA_CPP) -> LoadedModel:
        """Load the model `hub.current` names on `backend` and build its resources (engine thread). A failure after
        the runtime exists frees it before the error goes up: nothing is left holding a context."""
        settings = hub.current
        parts = backend.open(settings, emit)
        rt, kv, attention = parts.rt, parts.kv, parts.attention
        pool = None
        try:
            template = ChatTemplate(rt.meta("tokenizer.chat_template"), bos_token=rt.token_text("bos"),
                                    eos_token=rt.token_text("eos"))
            log.info("chat template: each turn renders %s", template.rendering)   # checked now, not in the first turn
            pool = SavedPool(settings.ram_budget_bytes, settings.cache_dir / "spill",
                             spill_budget_bytes=settings.spill_budget_bytes,
                             reserve_bytes=settings.disk_reserve_bytes, bits=settings.pool_bits,
                             on_spill=lambda b: emit(EngineEvent(EventKind.SPILLED, f"{b.name} spilled to disk",
                                                                 block=b.name, tokens=b.n_tokens)))
            files = KVFileStore(settings.cache_dir, model_hash(rt.model_path, settings.kv_cache_type, rt.n_ctx,
                                                               settings.slots, rt.flash_attention),
                                settings.ttl_seconds(), clock=clock, disk_budget_bytes=settings.disk_budget_bytes,
                                reserve_bytes=settings.disk_reserve_bytes)
            files.check(fix=True)
            chunks = ChunkIndex(files=KVFileChunks(files))
            chunks.files.catalogue(chunks)           # closed conversations' KV files: exact blocks to reuse
            return cls(hub=hub, rt=rt, kv=kv, template=template,
                       prefixes=SharedPrefixes(rt, kv, template), pool=pool, slots=SlotRegistry(settings.slots),
                       files=files, attention=attention, embedder=Embedder(settings.embedder), info=rt.info(),
                       subscriptions=follow_pool_settings(hub, pool), chunks=chunks)
        except BaseException:
            if pool is not None:
                pool.close()
            parts.close()
            raise

    def fit_warning(self, shared_tokens: int) -> str | None:
        """Why the slots' budgets may not fit in the context (an error event's text), or None when they fit."""
        s, rt = self.settings, self.rt
        if not rt.slots_share_cells:                # each slot in its own context or stream, with a copy of the
            # prefix; a wide recovery's overdraft takes only the cells past these (ConversationMemory clamps it)
            cells, room = s.budget_tokens + 2 * s.block_tokens, rt.n_ctx_per_context
        else:
            cells = (shared_tokens + s.slots * max(0, s.budget_tokens - shared_tokens) + s.recovery_overdraft_tokens
                     + 2 * s.block_tokens)
            room = rt.n_ctx
        if cells > room:
            return (f"{s.slots} slots of {s.budget_tokens} tokens may not fit in a context of {room}; "
                    f"raise n_ctx or lower slots or budget")
        return None

    def close(self) -> None:
        """Free the host pool, the prefixes, the contexts and the model, then the attention capture (after the
        contexts that called into it). Open conversations must have been released first."""
        if self.closed:
            return
        self.closed = True
        for subscription in self.subscriptions:
            subscription.cancel()
        self.pool.close()
        if isinstance(self.chunks.files, KVFileChunks):
            self.chunks.files.close()
        self.prefixes.clear()
        BackendParts(rt=self.rt, kv=self.kv, attention=self.attention).close()


POOL_SETTINGS = ("ram_budget_bytes", "pool_bits")


def follow_pool_settings(hub: SettingsHub, pool: SavedPool) -> list[Subscription]:
    """The pool adopts a new RAM budget (spilling past it) and bit width (for blocks saved from then on)."""
    def changed(old: Settings, new: Settings) -> None:
        if new.ram_budget_bytes != old.ram_budget_bytes:
            pool.set_budget(new.ram_budget_bytes)
        if new.pool_bits != old.pool_bits:
            pool.set_bits(new.pool_bits)
    return [hub.subscribe(changed, fields=POOL_SETTINGS)]


def follow_ttl_settings(hub: SettingsHub, files: Callable[[], KVFileStore | None]) -> Subscription:
    """The KV files `files()` gives (those of the model loaded last: they outlive it) adopt new TTLs, so their
    expiry is computed with them from the change on, and a new disk budget (enforced at once and on each write)."""
    def changed(old: Settings, new: Settings) -> None:
        store = files()
        if store is None:
            return
        if new.ttl_seconds() != old.ttl_seconds():
            store.set_ttl_seconds(new.ttl_seconds())
        if new.disk_budget_bytes != old.disk_budget_bytes:
            store.set_disk_budget(new.disk_budget_bytes)
    return hub.subscribe(changed, fields=(*TTL_SETTINGS, "disk_budget_bytes"))
