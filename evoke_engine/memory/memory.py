"""One conversation's KV memory policy: watermarks, making room, what to evict and recover, turn ends.

Invariants (engine thread only): it decides and `ResidentSequence` (resident.py) acts: every change to
positions, states and cells goes through `self.sequence`, which keeps the table equal to the slot; at every
turn end `active_tokens <= budget_tokens` unless protected blocks alone exceed it (reported, never silent); within a
turn only a wide recovery's `overdraft` (at most `recovery_overdraft_tokens`) may run over it; a turn's end keeps
the recovery its reply quoted before the others (`recovery_keep_used`: other similarity recoveries leave, saved).
A budget is at least `min_budget_tokens` of its prefix: then a reply of any length fits (`evict_within`
gives up the turn's protections one by one, never the recent tail) and the budget never cuts it. A turn asks
through the reply protocol (`begin_turn`, `open_reply`, `grow_reply`, `reply_needs_room`/`make_reply_room`,
`split_reply`, `close_reply`, `settle_rollback`): nothing outside memory/ touches `sequence`, `counters` or `turn`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, replace

import numpy as np

from ..errors import BudgetError, InvariantError, RestoreError
from ..events import EngineEvent, EventKind
from ..kvcache.blocks import Block, BlockState, BlockTable
from ..kvcache.chunk_index import ChunkIndex, ChunkSource
from ..kvcache.pool import SavedPool
from ..kvcache.prefixes import Prefix, SharedPrefixes
from ..kvcache.resident import ResidentSequence
from ..runtime.kv import KVPrimitives
from ..runtime.runtime import Runtime
from ..settings import Settings
from ..stats import ConversationStats, Counters
from . import recall_signals
from .attention_signal import AttentionSignal
from .embedder import Embedder
from .glosses import BOOK as GLOSSES
from .policy import RecoveryPick, choose_recoveries, choose_victims, file_neighbours, named_in, protected_blocks
from .recall_signals import MODES, RecallSignal, export_lines, message_asks, only_asks, reply_grounding, seed_lines
from .recall_signals import prepare as prepare_lines
from .recovery import Breadcrumb, RecoveryBackend
from .recovery import backend as recovery_backend
from .recovery_plan import RecoveryPlan, staying_tokens, table_state
from .scorer import Scorer, TaskFocus
from .snapshot import Snapshot, SnapshotError
from .snapshot_check import MAX_AHEAD


def min_budget_tokens(prefix_tokens: int, settings: Settings) -> int:
    """The smallest budget in which a reply of any length grows without being cut: the shared prefix (the
    first block, the sink, when there is no prefix), the recent tail that is never evicted (`tail_fraction`
    of the budget, plus the block straddling its edge, at most `block_tokens`) and the next token. The rest,
    the question and the reply's own older blocks included, leaves (saved, recoverable) when the reply needs
    its room. Settings validate `tail_fraction` < 1."""
    fixed = prefix_tokens + settings.block_tokens + (0 if prefix_tokens else settings.block_tokens)
    budget = max(1, math.floor((fixed - 1) / (1 - settings.tail_fraction)))
    while budget - int(budget * settings.tail_fraction) < fixed:
        budget += 1
    return budget


def require_budget(budget: int, prefix_tokens: int, kept_tokens: int, settings: Settings) -> None:
    """The one refusal of a budget below `min_budget_tokens` (a new conversation, a settings change, a
    conversation's own budget): BudgetError saying the smallest budget that works and what it must hold.
    `kept_tokens`: the blocks that never leave (kept files, pinned blocks), held like the prefix."""
    smallest = min_budget_tokens(prefix_tokens + kept_tokens, settings)
    if budget >= smallest:
        return
    held = (f"the shared prefix (system prompt and tools, {prefix_tokens} tokens)" if prefix_tokens
            else f"the first block (the sink, {settings.block_tokens} tokens)")
    if kept_tokens:
        held += f", the kept files and pinned blocks ({kept_tokens} tokens: let one go for a smaller budget)"
    raise BudgetError(f"a budget of {budget} tokens is too small: the smallest budget that works is {smallest} "
                      f"tokens, which holds {held} and the recent tail that is never evicted "
                      f"({settings.tail_fraction:.0%} of the budget and one {settings.block_tokens}-token block), "
                      "so that a reply of any length grows without being cut")


class ConversationMemory:
    def __init__(self, conversation_id: str, *, settings: Settings, runtime: Runtime, kv: KVPrimitives,
                 pool: SavedPool, embedder: Embedder, emit: Callable[[EngineEvent], None],
                 chunks: ChunkIndex | None = None) -> None:
        self.id = conversation_id
        self.settings = settings
        self.budget_tokens = settings.budget_tokens
        self.own_budget: int | None = None       # a budget set for this conversation alone (`set_budget`)
        self.rt, self.embedder = runtime, embedder
        self.emit = emit
        self.sequence = ResidentSequence(runtime=runtime, kv=kv, pool=pool, index=chunks,
                                         label=conversation_id)                # the only writer of the table
        self.scorer = Scorer(settings)
        self.attention = AttentionSignal(kv.mirror)      # inert unless the capture is on
        self.focus = TaskFocus(ema=settings.focus_ema, snap_cosine=settings.focus_snap_cosine)
        self.turn = 0
        self.counters = Counters()
        self.events: deque[EngineEvent] = deque(maxlen=200)
        self.decisions: deque[dict] = deque(maxlen=50)   # why each recent recovery was chosen
        self._query_text = ""
        self._query: np.ndarray | None = None
        self._query_ready = True
        self.last_decide_s = 0.0                 # the last recovery decision: embedding, signals, choosing
        self.last_embed_s = 0.0                  # of which embedding (the new message only; `Embedder.embed_s`)
        self.last_restore_s = 0.0                # the last recovery's splices of saved bytes back (and breadcrumbs)
        self._warming_turn = False               # this turn decided without the embedder (it was warming up)
        self.last_breakdown: dict = {}           # the last turn's time by phase (`conversations.breakdown`)
        self._spliced_run: tuple | None = None   # (source block, our block, source owner) of the last splice
        self.overdraft = 0                       # tokens this turn may run over the budget (a wide recovery)
        self.embedding_due = False               # a turn ended and its blocks' vectors wait for idle time
        self._recovered: list[tuple[Block, dict]] = []   # this turn's recoveries, best ranked first, and why
        self.turn_protected: list[Block] = []    # resident blocks a wide recovery's working set keeps this turn
        self._working: dict[Block, int] = {}     # that working set, block -> rank
        self._ahead: RecoveryPlan | None = None  # the next message's recovery, decided while it was typed
        self.reply_context: tuple[str, ...] = ()  # blocks resident when the last reply started (a turn end may evict)

    # -- accounting (read only: `sequence` writes) --------------------------------------------
    @property
    def table(self) -> BlockTable:
        return self.sequence.table

    @property
    def seq(self) -> int | None:
        """The slot (llama.cpp sequence) the conversation is in; None while parked."""
        return self.sequence.seq

    @property
    def image(self) -> Block | None:
        return self.sequence.image

    @property
    def active_tokens(self) -> int:
        return self.sequence.active_tokens

    @property
    def prefix_tokens(self) -> int:
        return self.sequence.prefix_tokens

    @property
    def recovery(self) -> RecoveryBackend:
        """The backend `settings.recovery` names now (the setting applies at once)."""
        return recovery_backend(self.settings.recovery)

    @property
    def eviction_enabled(self) -> bool:
        return self.recovery.evicts and self.rt.eviction_supported

    def cached_tokens(self) -> int:
        return sum(b.n_tokens for b in self.table.saved())

    def record_event(self, kind: EventKind, message: str, block: Block | None = None,
                     detail: dict | None = None) -> None:
        """Keep the event in this conversation's recent events and hand it to the engine's subscribers."""
        event = EngineEvent(kind=kind, conversation_id=self.id, message=message,
                            block=block.name if block else None, tokens=block.n_tokens if block else 0,
                            time=time.time(), detail=detail)
        self.events.append(event)
        self.emit(event)

    # -- the current message, embedded only when a decision needs it ----------------------
    def set_query(self, text: str) -> None:
        self._query_text, self._query, self._query_ready = text, None, False

    def expect_query(self, text: str) -> None:
        """The coming turn's query will be `text`: where a recovery decision will read it (saved blocks to rank),
        its embedding starts now, beside the turn's other work before the decision (`Embedder.embed_soon`), so a
        message sent cold waits for less of it. Elsewhere nothing starts: the vector is made after the reply (the
        task focus), not beside the message's decode."""
        soon = getattr(self.embedder, "embed_soon", None)
        if soon is not None and self.settings.recovery_top_k != 0 and self.candidates():
            soon(self._dense_query(text))

    @property
    def query(self) -> np.ndarray | None:
        if not self._query_ready:
            self._query = self.embedder.embed_one(self._query_text) if self._query_text.strip() else None
            self._query_ready = True
        return self._query

    def _recall_query(self) -> np.ndarray | None:
        """The vector the recall signal ranks saved lines by: the message's (`query`, which the eviction scorer reads
        too), or its question alone where `_dense_query` says so (`embed_one` keeps it for the turn)."""
        text = self._dense_query(self._query_text)
        if text == self._query_text:
            return self.query
        return self.embedder.embed_one(text) if text.strip() else None

    def _dense_query(self, text: str) -> str:
        """What the recall signal's vector is made of: the question alone where `recall_signals.QUESTION_QUERY` is on
        and the working set has grown (as the identifier words), else the whole message."""
        if recall_signals.QUESTION_QUERY and self.recovery_width() > self.settings.recovery_top_k:
            return recall_signals.question_only(text)
        return text

    # -- decoding new blocks ----------------------------------------------------------------
    def append_decoded(self, block: Block, *, current: Iterable[Block] = (), cancel=None) -> None:
        """Make room for `block`, decode its tokens at the tail and add it to the table."""
        self.make_room(block.n_tokens, current=current)
        self.sequence.append([block], cancel=cancel)
        self.counters.prefill_tokens += block.n_tokens

    def append_reused(self, block: Block, *, current: Iterable[Block] = (),
                      following: Sequence[Block] = ()) -> dict | None:
        """With `chunk_reuse` on: make room for `block` and splice it from another conversation's exact K/V (one
        of the same owner's, unless `chunk_reuse_across_owners`) when the chunk index holds its prefix hash
        (`following`: the message's blocks after it, which a KV file would also give). Returns what was reused (for
        `report_reuse`), or None: nothing changed but room, and the caller decodes it."""
        if not self.settings.chunk_reuse or self.sequence.index is None or self.seq is None:
            return None
        self.make_room(block.n_tokens, current=current)
        repair = self.settings.chunk_reuse_repair_tokens
        owner = None if self.settings.chunk_reuse_across_owners else self.sequence.index.owner_of(self.id)
        source = self.sequence.lookup(block, approximate=self.settings.chunk_reuse_approximate
                                      and block.n_tokens > repair,
                                      prefer=self._spliced_run[2] if self._spliced_run else None,
                                      following=following, owner=owner)
        if source is None:
            self._spliced_run = None
            return None
        if not source.exact and self._continues_run(source):
            repair = 0                  # the source's next block after the one just spliced: no seam between them
        try:
            self.sequence.splice(block, source, repair_tokens=repair)
        except RestoreError as exc:
            self.record_event(EventKind.ERROR, f"{block.name}: reuse failed ({exc}); decoding it", block)
            return None
        self._spliced_run = (source.block, block, source.owner) if source.owner is not None else None
        how = "exact" if source.exact else f"repaired {repair}"
        block.reused_from = f"{source.label}:{source.block_name} ({source.where}, {how})"
        repaired = 0 if source.exact else repair
        self.counters.reused_blocks += 1
        self.counters.reused_tokens += block.n_tokens - repaired
        self.counters.prefill_tokens += repaired
        return {"block": block.name, "from": f"{source.label}:{source.block_name}", "where": source.where,
                "exact": source.exact, "repaired": repaired, "tokens": block.n_tokens - repaired}

    def _continues_run(self, source: ChunkSource) -> bool:
        """`source` is the block right after the last spliced one in the same slot, and that splice is our tail."""
        if self._spliced_run is None or not self.table.resident:
            return False
        previous, ours, _ = self._spliced_run
        return (self.table.resident[-1] is ours and source.where == "slot" and previous.pos is not None
                and previous.state is BlockState.RESIDENT and source.block.pos == previous.pos + previous.n_tokens
                and any(b is previous for b in source.owner.table.resident))

    def report_reuse(self, reused: Sequence[dict]) -> None:
        """One BLOCKS_REUSED event for the blocks a message took from other conversations."""
        if not reused:
            return
        tokens = sum(r["tokens"] for r in reused)
        names = ", ".join(r["block"] for r in reused)
        self.record_event(EventKind.BLOCKS_REUSED, f"reused {len(reused)} blocks ({tokens} tokens): {names}",
                          detail={"blocks": list(reused), "tokens": tokens})

    @property
    def turn_limit_tokens(self) -> int:
        """The most active tokens this turn may hold: the budget, plus a wide recovery's overdraft until the turn
        ends (a reply grows within it)."""
        return self.budget_tokens + self.overdraft

    def make_room(self, needed: int, *, current: Iterable[Block] = ()) -> None:
        if not self.eviction_enabled:
            return
        high = int(self.budget_tokens * self.settings.high_watermark) + self.overdraft
        if self.active_tokens + needed > high:
            low = int(self.budget_tokens * self.settings.low_watermark) + self.overdraft
            self.evict_to(max(0, low - needed), current=[*current, *self.turn_protected])

    # -- eviction ---------------------------------------------------------------------------
    def ensure_embeddings(self, blocks: Iterable[Block]) -> None:
        missing = [b for b in blocks if b.embedding is None and b.text.strip()]
        if not missing or not self.embedder.enabled:
            return
        vectors = self.embedder.embed([b.text for b in missing])
        if vectors is None:                          # the embedder is warming up: made when next asked for
            return
        for block, vector in zip(missing, vectors, strict=True):
            block.embedding = vector

    def score(self, block: Block) -> float:
        return self.scorer.score(block, query=self.query, focus=self.focus.vector, current_turn=self.turn,
                                 attention=self.attention.value(block))

    def evict_to(self, target_tokens: int, *, current: Iterable[Block] = ()) -> list[Block]:
        """Evict lowest-scored evictable blocks until active <= target (or nothing is left)."""
        if not self.eviction_enabled or self.active_tokens <= target_tokens:
            return []
        tail = int(self.budget_tokens * self.settings.tail_fraction)
        protected = protected_blocks(self.table, tail_tokens=tail, current=current)
        self.ensure_embeddings(b for b in self.table.resident if b not in protected)
        self.attention.refresh(self.seq, self.table.resident, self.settings.attention_aggregation)
        victims = choose_victims(self.table, target_tokens=target_tokens, protected=protected,
                                 score=self.score)
        self._evict(victims)
        return victims

    def _embed_lines(self, blocks: Iterable[Block]) -> None:
        """Embed the recall signal's line vectors for `blocks` now, so a later recovery decision finds them cached."""
        prepare_lines(self.embedder, self.settings.recall_signal, blocks,
                      file_names=self.settings.recall_file_name_line,
                      skip_questions=self.settings.recall_skip_questions,
                      line_context=self.settings.recall_line_context,
                      words=self._identifier_words_apply(), glosses=self.glosses_apply(),
                      beside=self._context_beside_apply(), before=self._file_text_before)

    def _file_text_before(self, block: Block) -> str:
        """The text of `block`'s file ahead of it in the same message (its earlier blocks), for parent keys."""
        ahead = []
        for other in self.table.blocks:
            if other is block:
                return "".join(ahead)
            if other.file_name == block.file_name and other.turn == block.turn and other.role == "file":
                ahead.append(other.text)
        return ""

    def _evict(self, victims: list[Block], because: str = "") -> None:
        """Evict `victims` the way the recovery backend keeps them (bytes to the pool, or dropped), with events."""
        if not victims:
            return
        self._embed_lines(victims)                  # now, not in a later decision
        why = f": {because}" if because else ""
        for block in self.sequence.evict(victims, keep_bytes=self.recovery.keeps_bytes):
            self.counters.evictions += 1
            self.counters.evicted_tokens += block.n_tokens
            self.record_event(EventKind.EVICTED, f"evicted {block.name} ({block.n_tokens} tokens){why}", block)

    def evict_within(self, limit: int, target: int, keeps: Sequence[Iterable[Block]]) -> bool:
        """Evict to `target` keeping `keeps[0]`; while active tokens stay over `limit`, evict to `limit`
        keeping each later (smaller) set in turn. True when active <= limit after."""
        for level, keep in enumerate(keeps):
            if level and self.active_tokens <= limit:
                break
            self.evict_to(target if level == 0 else limit, current=keep)
        return self.active_tokens <= limit

    def min_budget_tokens(self) -> int:
        """The smallest budget this conversation accepts (`min_budget_tokens` of its prefix and kept blocks)."""
        return min_budget_tokens(self.held_tokens, self.settings)

    @property
    def kept_tokens(self) -> int:
        """Tokens of the blocks that never leave the context: kept files and pinned blocks."""
        return sum(b.n_tokens for b in self.table.blocks if b.pinned)

    @property
    def held_tokens(self) -> int:
        """What a budget holds before the recent tail and a reply: the shared prefix and the kept blocks."""
        return self.prefix_tokens + self.kept_tokens

    def end_turn(self, *, keep: Iterable[Block] = (), reply: str = "") -> None:
        """Keep what the `reply` used (`recovery_keep_used`: when it quoted a block, this turn's other similarity
        recoveries leave), then evict to the low watermark if the turn crossed the high one; `keep` (this turn's
        recoveries) stays unless the budget needs its room, and then the worst kept goes first (`_kept_order`). A
        wide recovery's overdraft ends here: the budget holds again."""
        self.overdraft = 0
        used = self._reply_used(reply)
        if used and self.settings.recovery_keep_used and self.eviction_enabled:
            unused = [b for b, detail in self._recovered if b.state is BlockState.RESIDENT and b not in used
                      and detail["reason"] == "similar"]      # a re-attached or named file stays: it was asked for
            self._evict(unused, because="the reply did not use it")
        if self.eviction_enabled and self.active_tokens > int(self.budget_tokens * self.settings.high_watermark):
            kept = self._kept_order(list(dict.fromkeys([*keep, *self.turn_protected])), used)
            self.evict_within(self.budget_tokens, int(self.budget_tokens * self.settings.low_watermark),
                              [kept[:n] for n in range(len(kept), -1, -1)])
        for block, detail in self._recovered:
            detail["kept_at_turn_end"] = block.state is BlockState.RESIDENT
        self._recovered, self.turn_protected, self._working = [], [], {}
        if self.active_tokens > self.budget_tokens and self.eviction_enabled:
            self.record_event(EventKind.ERROR, f"protected blocks hold {self.active_tokens} tokens, over the budget "
                              f"of {self.budget_tokens}")
        self.counters.max_active_at_turn_end = max(self.counters.max_active_at_turn_end, self.active_tokens)
        self.sequence.flush_pending_shifts()     # pay the K-shift now, after the reply, not before the next one
        self.embedding_due = self.eviction_enabled       # this turn's blocks are embedded on idle time (embed_due)

    def embed_due(self) -> None:
        """Embed the blocks (and their lines) that ended turns left to do: the engine runs this on its idle
        time after each turn, so neither the reply's end nor the next first token waits for it; a decision or a
        KV file that comes first runs it itself, so nothing is ever decided or written without the vectors."""
        if not self.embedding_due or getattr(self.embedder, "warming", False):    # warming: once it is ready
            return
        self.embedding_due = False
        self.ensure_embeddings(b for b in self.table.resident if not b.shared)
        # saved blocks too: a KV file of an older format held no line vectors (cached ones cost nothing)
        self._embed_lines(b for b in self.table.blocks if not b.shared)

    def _reply_used(self, reply: str) -> dict[Block, int]:
        """The blocks from before this turn that the reply quoted (`reply_grounding` against the message), among
        this turn's recoveries and what was resident; each recovery's decision records its count."""
        if not self._recovered or not reply.strip():
            return {}
        earlier = [b for b in self.table.resident if not b.shared and b.turn < self.turn]
        used = reply_grounding(reply, self._query_text, dict.fromkeys([*earlier, *(b for b, _ in self._recovered)]))
        for block, detail in self._recovered:
            detail["reply_used"] = used.get(block, 0)
        return used

    def reply_starts(self) -> None:
        """The message is decoded and the reply is about to start: note what the reply reads (`reply_context`; a
        wide recovery's overdraft leaves at the turn end, so the blocks resident after the turn are fewer) and, with
        the capture on, how much the message's own queries (its last ones, decoded with the reply's opening) attend
        to each of this turn's recoveries, into its decision: `message_attention` (the block's share, 1 = the most
        attended resident block) and `message_attention_per_token` (per token, 1 = the densest of this turn's
        recoveries). The model as a judge of the recoveries, for the record (`bench recall --suite`): it decides
        nothing."""
        self.reply_context = tuple(b.name for b in self.table.resident if not b.shared)
        if not self.attention.enabled or not self._recovered:
            return
        self.attention.refresh(self.seq, self.table.resident, self.settings.attention_aggregation)
        density = {b: (self.attention.value(b) or 0.0) / max(1, b.n_tokens) for b, _ in self._recovered}
        top = max(density.values(), default=0.0)
        for block, detail in self._recovered:
            share = self.attention.value(block)
            detail["message_attention"] = None if share is None else round(share, 4)
            detail["message_attention_per_token"] = round(density[block] / top, 4) if top > 0 else None

    def _kept_order(self, keep: list[Block], used: dict[Block, int]) -> list[Block]:
        """This turn's recoveries (and a wide recovery's resident working set), the one to keep longest first: what
        the reply `used`, then the reply's attention share when the capture is on, then rank; other kept blocks
        first."""
        rank = {block: i for i, (block, _) in enumerate(self._recovered)}
        rank.update(self._working)                  # a wide recovery: its working set's joint rank
        if self.attention.enabled:
            self.attention.refresh(self.seq, self.table.resident, self.settings.attention_aggregation)
        share = (lambda b: self.attention.value(b) or 0.0) if self.attention.enabled else (lambda b: 0.0)
        return sorted(keep, key=lambda b: (b in rank, -used.get(b, 0), -share(b), rank.get(b, -1)))

    # -- the reply protocol: what a turn asks of its memory, in order ------------------------------
    @property
    def prefilled_tokens(self) -> int:
        """Tokens decoded into this conversation so far (its prefill counter: a rebuild's progress reads it)."""
        return self.counters.prefill_tokens

    def reset_focus(self) -> None:
        """A task boundary: the task focus forgets earlier messages."""
        self.focus.vector = None

    def pin(self, name: str, pinned: bool = True, priority: float | None = None) -> None:
        """Pin block `name` (never evicted) or change its priority multiplier; KeyError for no such block,
        BudgetError, changing nothing, when the budget could not hold it beside a reply."""
        block = next((b for b in self.table.blocks if b.name == name), None)
        if pinned and block is not None and not block.pinned:
            require_budget(self.budget_tokens, self.prefix_tokens, self.kept_tokens + block.n_tokens, self.settings)
        self.table.pin(name, pinned, priority)

    def keep_file(self, file_name: str, keep: bool = True) -> list[Block]:
        """Keep the attached file `file_name` (its latest attachment's blocks) in context until it is let go
        (`keep=False`): its saved blocks come back at the tail now (a splice each, no forward pass) and none of
        them is evicted while kept (pinned, in the KV file too). Returns the blocks brought back. KeyError: no such
        file; BudgetError, changing nothing, when the files kept with the shared prefix would leave a reply too
        little room (`min_budget_tokens`); blocks whose bytes are gone stay out (a re-attach decodes them)."""
        blocks = self._file_blocks(file_name)
        if not keep:
            for block in [b for b in self.table.blocks if b.file_name == file_name and b.pinned]:
                self.table.pin(block.name, False)
            self.record_event(EventKind.KEPT, f"{file_name} may leave the context again")
            return []
        others = sum(b.n_tokens for b in self.table.blocks if b.pinned and b not in blocks)
        kept = others + sum(b.n_tokens for b in blocks)
        smallest = min_budget_tokens(self.prefix_tokens + kept, self.settings)
        if self.budget_tokens < smallest:
            raise BudgetError(f"keeping {file_name} ({kept - others} tokens) in context needs a budget of at least "
                              f"{smallest} tokens, this conversation has {self.budget_tokens}: raise the budget or "
                              "let another kept file go")
        for block in blocks:
            self.table.pin(block.name, True)
        brought: list[Block] = []
        for block in blocks:
            if block.state in (BlockState.RAM, BlockState.DISK):
                self.make_room(block.n_tokens, current=brought)
                self.restore_block(block)
                brought.append(block)
        self.sequence.flush_pending_shifts()
        gone = [b.name for b in blocks if b.state is BlockState.DROPPED]
        self.record_event(EventKind.KEPT, f"{file_name} kept in context ({len(brought)} blocks brought back"
                          + (f"; {len(gone)} lost, attach it again to bring them back" if gone else "") + ")")
        return brought

    def _file_blocks(self, file_name: str) -> list[Block]:
        """The blocks of the latest attachment of `file_name` (KeyError when none)."""
        blocks = [b for b in self.table.blocks if b.role == "file" and b.file_name == file_name]
        if not blocks:
            raise KeyError(f"no attached file {file_name!r} in this conversation")
        latest = max(b.turn for b in blocks)
        return [b for b in blocks if b.turn == latest]

    def adopt_prefix(self, blocks: list[Block]) -> None:
        """A fresh conversation's first blocks: the shared prefix's, already in its slot."""
        self.sequence.adopt_prefix(blocks)

    def begin_turn(self, turn: int | None = None) -> int:
        """A new turn's number (the next one), or `turn` again (a regenerated or continued reply's own)."""
        self.turn = self.turn + 1 if turn is None else turn
        return self.turn

    def question_of(self, turn: int) -> list[Block]:
        """The resident user block of `turn`'s input (its last), kept while that turn's reply is written."""
        return [b for b in self.table.resident if b.message_key() == (turn, "input") and b.role == "user"][-1:]

    def decode_ahead(self, tokens: Sequence[int]) -> int:
        """Decode the first tokens of the message being typed (at most `MAX_AHEAD`, what a KV file holds ahead) at
        the tail ahead of it (`ResidentSequence.decode_ahead`): the turn that sends it decodes only the rest.
        Returns the tokens decoded now; nothing out of a slot."""
        if self.seq is None:
            return 0
        return self.sequence.decode_ahead(list(tokens)[:MAX_AHEAD])

    def open_reply(self, reply: Block, *, last_block: Block | None = None, current: Iterable[Block] = ()) -> None:
        """Room for the reply's opening (its tokens so far) and the message's `last_block` (not decoded yet, it goes
        in the same llama_decode call), then both at the tail: the reply grows from there."""
        pending = last_block.n_tokens if last_block is not None else 0
        self.make_room(pending + reply.n_tokens + 1, current=current)
        self.sequence.append([*([last_block] if last_block is not None else []), reply])
        if last_block is not None:
            self.counters.prefill_tokens += last_block.n_tokens

    def open_empty_reply(self, reply: Block, *, room: int, current: Iterable[Block] = ()) -> None:
        """A reply that never sampled (cancelled before its first token): its opening decoded with no logits."""
        self.make_room(room, current=current)
        self.sequence.append([reply], logits_last=False)

    def grow_reply(self, reply: Block, token: int) -> None:
        """The sampled `token` decoded at the tail, in the growing reply block."""
        self.sequence.extend_tail(reply, [token])

    def take_back_reply(self, reply: Block, n_tokens: int) -> None:
        """The growing reply's last `n_tokens` leave its cells and its tokens (the start of the stop string that
        ended it)."""
        self.sequence.take_back(reply, n_tokens)

    def reopen_reply(self, part: Block, closing: int) -> Block:
        """A finished reply grows again where it stopped (a continued reply): `part`, its last block and the last
        resident one, is replaced by a growing copy; its `closing` tokens and the opening held ahead leave their
        cells, and its last token decodes again for the logits the next token is sampled from. Returns the copy."""
        growing = replace(part, tokens=list(part.tokens), text="", hash="", embedding=None)
        self.sequence.split(part, [growing])
        last = growing.tokens[-closing - 1]
        self.sequence.take_back(growing, closing + 1)
        self.sequence.extend_tail(growing, [last])
        return growing

    def split_reply(self, reply: Block, pieces: list[Block]) -> None:
        """The growing reply block replaced by `pieces` (finished blocks, evictable like any other; the last may
        go on growing)."""
        self.sequence.split(reply, pieces)

    def reply_needs_room(self) -> bool:
        """Whether the next token would take the turn past its limit (the budget, plus a wide recovery's
        overdraft): the reply's finished parts are split off, then `make_reply_room`."""
        return self.eviction_enabled and self.active_tokens + 1 > self.turn_limit_tokens

    def make_reply_room(self, current: Iterable[Block], question: Sequence[Block], reply: Block, *,
                        room: int = 1) -> bool:
        """Room for the reply's next `room` tokens within the turn's limit: evict to the low watermark keeping this
        turn's `current` blocks (its recoveries and working set), the `question` and the `reply`; while still over
        the limit, let `current` go one at a time, the one to keep longest last (`_kept_order`, as a turn end does),
        then the question. False when even the reply alone is over it (the reply must stop: an event says so)."""
        limit = self.turn_limit_tokens - room
        low = int(self.budget_tokens * self.settings.low_watermark) + self.overdraft
        current = list(dict.fromkeys(current))
        self.evict_to(low, current=[*question, reply, *current])
        if self.active_tokens <= limit:
            return True                        # the usual case: the order below (and its attention read) not needed
        kept = self._kept_order(current, {})
        keeps = [[*question, reply, *kept[:n]] for n in range(len(kept) - 1, -1, -1)]
        if self.evict_within(limit, limit, [*keeps, [reply]]):
            return True
        self.record_event(EventKind.ERROR, "reply stopped: the budget is full of protected blocks")
        return False

    def close_reply(self, reply: Block, closing: list[int], *, next_opening: Sequence[int] = (),
                    current: Iterable[Block] = ()) -> None:
        """The template's closing decoded after the reply, with the next user message's opening held ahead (the
        next turn's first token then waits for the message's own tokens only)."""
        self.make_room(len(closing) + len(next_opening), current=[*current, reply])
        self.sequence.extend_tail(reply, closing, ahead=list(next_opening), logits_last=False)

    def settle_rollback(self, turn: int) -> None:
        """After blocks left for good (an edit, a delete): the turn number the history ends at, and llama.cpp's
        pending K-shift applied."""
        self.turn = turn
        self.sequence.flush_pending_shifts()

    # -- blocks that leave for good (edits) and forks -----------------------------------------
    def remove_blocks(self, doomed: Iterable[Block]) -> None:
        """Take blocks out of the conversation for good (their message was edited away or deleted)."""
        self.sequence.remove(doomed)

    def share_into(self, child: ConversationMemory) -> None:
        """Make `child` (fresh, in its slot, prefix shared) hold this conversation's blocks (no decode, no
        copy: `ResidentSequence.share_into`), its turn, budget and task focus."""
        self.sequence.share_into(child.sequence)
        child.turn = self.turn
        child.budget_tokens, child.own_budget = self.budget_tokens, self.own_budget
        child.focus.vector = None if self.focus.vector is None else self.focus.vector.copy()

    # -- recovery ---------------------------------------------------------------------------
    def candidates(self) -> list[Block]:
        return self.recovery.candidates(self.table.blocks)

    def recover(self, message: str, *, message_tokens: int, reply_reserve: int,
                identity_hashes: set[str] = frozenset()) -> list[Block]:
        """Bring back saved blocks this message needs, at the tail, before its tokens decode: the plan made while
        it was typed (`recover_ahead`) when nothing changed since, else a decision made now."""
        started = time.perf_counter()
        embedded_before = getattr(self.embedder, "embed_s", 0.0)
        self.last_decide_s = self.last_embed_s = self.last_restore_s = 0.0
        self._reset_turn_recovery()
        plan, self._ahead = self._ahead, None
        inputs = (message, message_tokens, reply_reserve, frozenset(identity_hashes))
        if plan is None or not plan.matches(*inputs, settings=self.settings, budget_tokens=self.budget_tokens,
                                            embedder=self.embedder, table=self.table):
            plan = self.plan_recovery(*inputs)
        self.last_decide_s = time.perf_counter() - started
        self.last_embed_s = getattr(self.embedder, "embed_s", 0.0) - embedded_before
        restoring = time.perf_counter()
        recovered = self._carry_out(plan, turn=self.turn)
        self.last_restore_s = time.perf_counter() - restoring
        return recovered

    def recover_ahead(self, message: str, *, message_tokens: int, reply_reserve: int,
                      identity_hashes: set[str] = frozenset()) -> None:
        """While the next message is typed: decide its recovery and bring back now what fits the budget's room
        (not a wide recovery's overdraft, which only a turn may take), so that sending it waits for neither. The
        rest of the plan is kept for `recover`, which uses it only if the message and everything the decision
        read are the same then. Nothing else of the turn starts here."""
        self._ahead = None
        plan = self.plan_recovery(message, message_tokens, reply_reserve, frozenset(identity_hashes))
        fits, used = [], 0
        for pick in plan.picks:
            if used + pick.block.n_tokens > plan.room:
                break
            fits.append(pick)
            used += pick.block.n_tokens
        if fits:
            self._reset_turn_recovery()
            self._carry_out(plan, turn=self.turn + 1, picks=fits)
            plan.done = list(self._recovered)
            plan.picks = plan.picks[len(fits):]
            plan.move_best = None                      # moved already
            self._reset_turn_recovery()                # the turn sets them again from the plan
            plan.table_seen = table_state(self.table)
        self._ahead = plan

    def _reset_turn_recovery(self) -> None:
        self.overdraft, self._recovered, self.turn_protected, self._working = 0, [], [], {}

    def plan_recovery(self, message: str, message_tokens: int, reply_reserve: int,
                      identity_hashes: frozenset[str] = frozenset()) -> RecoveryPlan:
        """Decide which saved blocks `message` needs back, changing nothing but vectors made on the way (its
        own, and blocks that lacked theirs)."""
        self.embed_due()                             # the user was quicker than the idle time (counted as embedding)
        plan = RecoveryPlan(message, message_tokens, reply_reserve, identity_hashes, self.settings,
                            self.budget_tokens, self.embedder, table_state(self.table), picks=[])
        saved = self.candidates()
        if not saved or self.settings.recovery_top_k == 0 and not identity_hashes:
            return plan
        # the embedder warming up: decide with the lexical signal now rather than wait for it (said in each decision)
        plan.warming = warming = self.embedder.enabled and getattr(self.embedder, "warming", False)
        if self.settings.recovery_top_k == 0 or not (self.embedder.enabled or warming):
            saved = [b for b in saved if b.hash in identity_hashes or (b.file_name and b.file_name in message)]
        residents = [b for b in self.table.resident if not b.shared]
        if not warming:
            self.ensure_embeddings(saved)            # no-ops after a turn end or a KV file: vectors are kept
            self.ensure_embeddings(residents)
        plan.signal = signal = RecallSignal(
            "lexical" if warming else self.settings.recall_signal, query_text=self._query_text,
            query=None if warming else self._recall_query, saved=saved, residents=residents, embedder=self.embedder,
            user_margin=self.settings.recall_user_margin, file_names=self.settings.recall_file_name_line,
            skip_questions=self.settings.recall_skip_questions, line_context=self.settings.recall_line_context,
            value_lines=self._value_lines_apply(), embed_lines=False, words=self._identifier_words_apply(),
            glosses=self.glosses_apply(), beside=self._context_beside_apply())
        fixed = sum(b.n_tokens for b in self.table.resident if b.shared or b.pinned)
        plan.room = max(0, int(self.budget_tokens * self.settings.high_watermark) - fixed - message_tokens
                        - reply_reserve)
        plan.wide = wide = self._overdraft_allowed()
        working = self._working_set(saved, residents, signal) if wide else None
        plan.working = working or {}
        if working and not (identity_hashes or any(named_in(message, b) for b in saved)):
            plan.move_best = self._best_to_move(working, plan.room + wide)
            saved = saved + ([plan.move_best] if plan.move_best is not None else [])   # it comes back first
        if working:    # its resident blocks stay through the turn (`_carry_out`): the picks share the room with them
            plan.room = max(0, plan.room - staying_tokens(working, plan.move_best))
        plan.picks = choose_recoveries(saved, message=message, similarity=signal.similarity,
                                       resident_best=signal.resident_best,
                                       top_k=self.recovery_width() if working is None else len(working),
                                       room_tokens=plan.room + wide, identity_hashes=identity_hashes,
                                       tie_break=self.attention.last if self.attention.enabled else None,
                                       margin=self.settings.recovery_margin if working is None else math.inf,
                                       eligible=None if working is None else working.__contains__)
        return plan

    def _carry_out(self, plan: RecoveryPlan, *, turn: int, picks: list[RecoveryPick] | None = None) -> list[Block]:
        """Bring back `picks` (the plan's, by default) after what the plan did ahead; the recovered blocks, best
        first. Sets this turn's working set, protections and overdraft from the plan."""
        picks = plan.picks if picks is None else picks
        self._warming_turn = plan.warming
        self._working = dict(plan.working)
        self.turn_protected = [b for b in plan.working if b.state is BlockState.RESIDENT and b is not plan.move_best]
        self._recovered = [(b, detail) for b, detail in plan.done if b.state is BlockState.RESIDENT]
        recovered = [b for b, _ in self._recovered]
        if plan.move_best is not None:
            self._evict([plan.move_best], because="the message's best match, moved next to it")
            if plan.move_best.state not in (BlockState.RAM, BlockState.DISK):
                picks = [p for p in picks if p.block is not plan.move_best]    # dropped: it cannot come back
        total = sum(p.block.n_tokens for p in picks) + sum(b.n_tokens for b in recovered)
        self.overdraft = min(plan.wide, max(0, total - plan.room))
        used = sum(b.n_tokens for b in recovered)
        for pick in picks:
            used += pick.block.n_tokens
            self.make_room(pick.block.n_tokens, current=recovered)
            detail = self._explain(pick, plan.signal, turn=turn, past_room=used > plan.room)
            block = self._bring_back(pick, detail)
            if block is None:
                continue
            recovered.append(block)
            self._recovered.append((block, detail))
            if pick.reason == "identity":
                self.counters.identity_hits += 1
        return recovered

    def _best_to_move(self, working: dict[Block, int], room_tokens: int) -> Block | None:
        """A wide recovery's best match, when it is resident but out of the recent tail, leaves and comes back with
        the turn's recoveries (a splice each way, no forward pass), so it sits next to the message: models read a
        block near the question better than one deep in the context (Liu et al., "Lost in the Middle"). Only when
        it fits the turn's `room_tokens` (it comes back first); the block, or None."""
        best = min(working, key=working.__getitem__)
        tail = int(self.budget_tokens * self.settings.tail_fraction)
        if (best.state is not BlockState.RESIDENT or best.pinned or best is self.table.blocks[0]
                or best.end > self.active_tokens - tail or best.n_tokens > room_tokens):
            return None
        return best

    def _value_lines_apply(self) -> bool:
        """Whether only value lines set the dense score this turn (`recall_value_lines`): the message asks for a
        value and the working set has grown past `recovery_top_k` (a budget over `recovery_width_tokens`; smaller
        ones decide as before, where the rule cost the short recall suite an identifier fact)."""
        return (self.settings.recall_value_lines and self.recovery_width() > self.settings.recovery_top_k
                and message_asks(self._query_text))

    def _identifier_words_apply(self) -> bool:
        """Whether the recall signals read lines with identifiers as words and abbreviations expanded (issue 61,
        `recall_signals.IDENTIFIER_WORDS`): where the working set has grown past `recovery_top_k` (a budget over
        `recovery_width_tokens`), as `_value_lines_apply`; smaller budgets decide as before (at 512 the words cost
        `bench retrieval` one env-line probe). The same for every turn of a budget, so turn-end lines and a
        decision's keys agree."""
        return recall_signals.IDENTIFIER_WORDS and self.recovery_width() > self.settings.recovery_top_k

    def _context_beside_apply(self) -> bool:
        """Whether structured lines are also embedded spelled out with their context, beside the written line
        (`recall_signals.CONTEXT_BESIDE`, issue 61): where the identifier words apply, and only when
        `recall_line_context` does not already embed the spelled-out form instead."""
        return (recall_signals.CONTEXT_BESIDE and not self.settings.recall_line_context
                and self._identifier_words_apply())

    def glosses_apply(self) -> bool:
        """Whether the recall signals read the loaded model's glosses of value lines beside them (issue 61,
        `recall_glosses` not "off"; `glosses.BOOK`): a block without any reads as before."""
        return self.settings.recall_glosses != "off"

    def embed_glossed(self, blocks: Iterable[Block]) -> None:
        """Embed the lines of blocks whose glosses were just written (idle time: the gloss writer's job), so a
        later decision finds them cached; nothing when glosses are not read."""
        if self.glosses_apply():
            self._embed_lines(blocks)

    def recovery_width(self) -> int:
        """Blocks one recovery decision may consider: `recovery_top_k` for each `recovery_width_tokens` of the
        budget (at least once): a day at 4096 tokens has room for four times the blocks of one at 1024, and a fixed
        8 left facts ranked 9th-28th in the pool. Budgets up to `recovery_width_tokens` keep `recovery_top_k`; 0
        when it is 0 (similarity recovery off)."""
        top_k, per = self.settings.recovery_top_k, self.settings.recovery_width_tokens
        return top_k * max(1, self.budget_tokens // per) if per > 0 else top_k

    def _overdraft_allowed(self) -> int:
        """How far past the room this turn's recovery may go: `recovery_overdraft_tokens` when blocks come back as
        bytes and a signal ranks them (an embedder, or the lexical signal alone), never past a slot context's own
        cells (the budget and two blocks of slack stay free, as `LoadedModel.fit_warning` counts)."""
        wide = self.settings.recovery_overdraft_tokens
        ranked = self.embedder.enabled or MODES[self.settings.recall_signal][0] is None
        if not wide or self.recovery.brings_back != "bytes" or not ranked or self.settings.recovery_top_k == 0:
            return 0
        if not getattr(self.rt, "slots_share_cells", True):
            cells = getattr(self.rt, "n_ctx_per_context", 0)
            wide = min(wide, max(0, cells - self.budget_tokens - 2 * self.settings.block_tokens))
        return wide

    def _working_set(self, saved: list[Block], residents: list[Block], signal: RecallSignal) -> dict[Block, int]:
        """A wide recovery's working set: the `recovery_width()` blocks, saved or resident, that the message ranks
        highest (block -> rank). It is the gate (no margin or role gate: every signal's scale passes): its saved
        blocks come back, its resident ones stay through the turn (`_carry_out` protects them), so a recovery never
        pushes out a resident block that ranks above it. With `recovery_file_neighbours`, the saved blocks next to the
        best `recovery_top_k` file blocks in their files join it last (at most half of `recovery_top_k`): they
        come back only where room is left (`policy.file_neighbours`). Once the width has grown past
        `recovery_top_k` (a budget over `recovery_width_tokens`; smaller ones decide as before): with
        `recovery_questions_last`, a message that asks for a value ranks the user's earlier questions that only
        asked (`only_asks`) after every other block; with `recovery_signal_tops`, each recall signal's own best
        saved blocks join the set after the fused top (`RecallSignal.own_tops`)."""
        pool = [b for b in (*saved, *residents) if b.role != "breadcrumb"]
        order = sorted(pool, key=lambda b: signal.similarity(b), reverse=True)
        width = self.recovery_width()
        grown = width > self.settings.recovery_top_k
        if grown and self.settings.recovery_questions_last and message_asks(self._query_text):
            order = [b for b in order if not only_asks(b)] + [b for b in order if only_asks(b)]
        order = order[:width]
        if grown and self.settings.recovery_signal_tops and hasattr(signal, "own_tops"):
            chosen = set(order)
            order += [b for b in signal.own_tops(saved, self.settings.recovery_signal_tops) if b not in chosen]
        if self.settings.recovery_file_neighbours:
            candidates = set(saved)
            order += file_neighbours(order[:self.settings.recovery_top_k], self.table.blocks,
                                     available=candidates.__contains__, limit=self.settings.recovery_top_k // 2)
        return {block: rank for rank, block in enumerate(order)}

    def _explain(self, pick, signal: RecallSignal, *, turn: int, past_room: bool = False) -> dict:
        """The signal values that chose `pick` (in its event and `stats().recovery_decisions`); `past_room`: it came
        back on the turn's overdraft (a wide recovery), and `kept_at_turn_end` says later whether it stayed."""
        detail = {"turn": turn, "block": pick.block.name, "reason": pick.reason,
                  "score": round(pick.similarity, 5), **signal.explain(pick.block)}
        if past_room:
            detail["past_room"] = True
        if self._warming_turn:
            detail["embedder_warming"] = "decided with the lexical signal while the embedder warmed up"
        self.decisions.append(detail)
        return detail

    def _bring_back(self, pick: RecoveryPick, detail: dict) -> Block | None:
        """Bring the picked block's content back at the tail the way the recovery backend says; the block now
        resident, or None when it could not come back. `detail` goes into the recovery event."""
        backend = self.recovery
        if backend.brings_back == "bytes":
            try:
                self.restore_block(pick.block)
            except RestoreError as exc:
                self.record_event(EventKind.ERROR, f"could not restore {pick.block.name}: {exc}", pick.block)
                return None
            how = f"{pick.reason}, {detail.get('signal', 'recall')} score {pick.similarity:.3g}"
            how += ", past the room" if detail.get("past_room") else ""
            self.record_event(EventKind.RECOVERED, f"recovered {pick.block.name} ({how})", pick.block,
                              detail=dict(detail))        # a copy: the turn end adds kept_at_turn_end to the decision
            return pick.block
        if backend.brings_back == "marker":
            return self.add_breadcrumb(pick.block, detail)
        raise NotImplementedError(f"recovery {backend.name!r} brings nothing back")

    def restore_block(self, block: Block) -> None:
        """Splice a saved block's K/V back at the tail (RestoreError: still saved, or DROPPED if its bytes are
        gone)."""
        self.sequence.restore(block)
        block.recoveries += 1
        self.counters.recoveries += 1
        self.counters.recovered_tokens += block.n_tokens

    def add_breadcrumb(self, block: Block, detail: dict | None = None) -> Block:
        """Decode a short marker of a dropped block's text at the tail; returns the marker block."""
        marker = Breadcrumb.marker(block)
        crumb = Block(name=f"breadcrumb:{block.name}", role="breadcrumb", turn=self.turn,
                      tokens=self.rt.tokenize(marker, parse_special=False), text=marker)
        self.append_decoded(crumb)
        self.counters.breadcrumbs += 1
        self.counters.recoveries += 1
        self.record_event(EventKind.RECOVERED, f"breadcrumb for {block.name}", crumb, detail=detail)
        return crumb

    # -- settings ---------------------------------------------------------------------------
    def adopt_settings(self, old: Settings, new: Settings) -> None:
        """The settings changed (a `SettingsHub` subscriber, engine thread): later decisions read `new`, and a
        new `budget_tokens` replaces this conversation's budget now, unless it has one of its own (`set_budget`)."""
        self.settings = new
        self.scorer.use_settings(new)
        self.focus.use_settings(new)
        if new.budget_tokens != old.budget_tokens and self.own_budget is None:
            self.set_budget(new.budget_tokens, own=False)

    # -- budget -----------------------------------------------------------------------------
    def set_budget(self, tokens: int | None, *, own: bool = True) -> None:
        """Adopt a new budget now (evicting to it); BudgetError, changing nothing, below `min_budget_tokens`. `own`:
        the conversation keeps it through later changes of the settings' budget and in its KV file; None goes
        back to following the settings."""
        budget = self.settings.budget_tokens if tokens is None else tokens
        require_budget(budget, self.prefix_tokens, self.kept_tokens, self.settings)
        self.budget_tokens = budget
        if own:
            self.own_budget = tokens
        if self.seq is not None and self.active_tokens > budget:
            self.evict_to(int(budget * self.settings.low_watermark))
            self.sequence.flush_pending_shifts()

    # -- slot parking -----------------------------------------------------------------------
    def park(self) -> None:
        """Leave the slot: the slot's own tokens are saved as one image; shared cells stay shared."""
        if self.seq is None:
            raise InvariantError(f"conversation {self.id} is not in a slot: nothing to park")
        self.sequence.park(self.turn)

    def enter_slot(self, seq: int, prefixes: SharedPrefixes, prefix: Prefix) -> None:
        """Into slot `seq`: its cells emptied, the prefix shared in, the parked image restored in place, a new
        conversation's first opening held ahead (`ResidentSequence.enter_slot`). RestoreError when the image is lost
        (the caller rebuilds the conversation)."""
        self.sequence.enter_slot(seq, prefixes, prefix)

    def unpark(self, seq: int) -> None:
        """Back into a slot whose prefix cells were already shared in (the simulator's and tests' own setup):
        restore the image in place. Raises RestoreError when the image is lost."""
        self.sequence.unpark(seq)

    # -- persistence ------------------------------------------------------------------------
    def snapshot(self, prefix_key: str, history: list[dict]) -> Snapshot:
        """Everything needed to bring this conversation back without a forward pass."""
        self.embed_due()                             # the file keeps every line vector
        image, ahead = self.sequence.image_bytes()
        focus = None if self.focus.vector is None else [float(x) for x in self.focus.vector]
        return Snapshot(conversation_id=self.id, prefix_key=prefix_key, turn=self.turn,
                        budget_tokens=self.budget_tokens, own_budget=self.own_budget, history=history,
                        blocks=self.table.blocks,
                        image=image, saved=self.sequence.saved_bytes(), counters=asdict(self.counters), focus=focus,
                        embedder=self.embedder.identity, ahead=ahead,
                        ahead_opening=self.sequence.ahead_opening(), chunks=self.sequence.chunk_records(),
                        exact=self.sequence.exact,
                        lines=export_lines(self.embedder, [b for b in self.table.blocks if not b.shared]),
                        glosses=GLOSSES.export(b.hash for b in self.table.blocks if not b.shared))

    def load_snapshot(self, snapshot: Snapshot, prefix_tokens: int) -> None:
        """Adopt a snapshot's table while out of a slot; `unpark` then restores its image."""
        if self.seq is not None or self.table.blocks:
            raise InvariantError("a snapshot is loaded into a fresh memory, out of any slot")
        resident = sorted((b for b in snapshot.blocks if b.state is BlockState.RESIDENT), key=lambda b: b.pos)
        shared = sum(b.n_tokens for b in resident if b.shared)
        total = sum(b.n_tokens for b in resident)
        if shared != prefix_tokens:
            raise SnapshotError(f"snapshot prefix of {shared} tokens, current prefix {prefix_tokens}")
        image_tokens = snapshot.image[2] if snapshot.image else 0
        mismatch = total - shared + len(snapshot.ahead) != image_tokens
        if mismatch or (snapshot.image and snapshot.image[1] != prefix_tokens):
            raise SnapshotError("snapshot image does not match its block table")
        self.sequence.load(snapshot.blocks, snapshot.saved, snapshot.image, snapshot.ahead, snapshot.turn,
                           chunks=snapshot.chunks, exact=snapshot.exact, opening=snapshot.ahead_opening)
        self.turn = snapshot.turn
        self.own_budget = snapshot.own_budget          # a budget of its own stays; else today's settings' budget,
        self.budget_tokens = max(snapshot.own_budget or self.settings.budget_tokens,     # at least what holds its
                                 min_budget_tokens(prefix_tokens + self.kept_tokens, self.settings))  # kept files
        for key, value in snapshot.counters.items():
            if hasattr(self.counters, key):
                setattr(self.counters, key, value)
        if snapshot.focus is not None:
            self.focus.vector = np.asarray(snapshot.focus, dtype=np.float32)
        GLOSSES.seed(snapshot.glosses)                 # before the line vectors: their keys carry the glosses' digest
        self.adopt_line_vectors(snapshot)

    def adopt_line_vectors(self, snapshot: Snapshot) -> int:
        """The KV file's line vectors into the recall signal's cache when this embedder made them (a reopen embeds
        none of its blocks); the count adopted. An older file holds none: the next turn end embeds them."""
        if not snapshot.lines or snapshot.embedder is None or snapshot.embedder != self.embedder.identity:
            return 0
        return seed_lines(self.embedder, snapshot.lines)

    def adopt_embedder(self, embedder: Embedder, focus: list[float] | None) -> None:
        """Switch embedder: every vector of the old one is dropped (recomputed on demand), focus replaced."""
        self.embedder = embedder
        for block in self.table.blocks:
            block.embedding = None
        self.set_query(self._query_text)
        self.focus.vector = None if focus is None else np.asarray(focus, dtype=np.float32)

    def release(self) -> None:
        """Forget every byte this conversation holds (slot cells and pool entries)."""
        self.sequence.release()

    def memory_location(self) -> str:
        return self.sequence.location()

    def check(self) -> None:
        self.sequence.check()

    def _block_summaries(self) -> Iterator[dict]:
        """`Block.summary()` of every block, with its attention share when the capture is on: current for
        resident blocks, last known for saved ones (the memory panel's Attention column)."""
        if not self.attention.enabled:
            yield from (b.summary() for b in self.table.blocks)
            return
        self.attention.refresh(self.seq, self.table.resident, self.settings.attention_aggregation)
        for block in self.table.blocks:
            share = self.attention.value(block)
            if share is None and not block.shared:
                share = self.attention.last_known.get(block.name)
            yield {**block.summary(), "attention": share}

    def stats(self) -> ConversationStats:
        return ConversationStats(
            conversation_id=self.id, active_tokens=self.active_tokens, budget_tokens=self.budget_tokens,
            cached_tokens=self.cached_tokens(), prefix_tokens=self.prefix_tokens, **asdict(self.counters),
            turn=self.turn, memory=self.memory_location(),
            recovery=self.settings.recovery, blocks=tuple(self._block_summaries()),
            events=tuple(e.as_dict() for e in list(self.events)[-50:]),
            recovery_decisions=tuple(self.decisions), reply_context=self.reply_context,
            turn_breakdown=dict(self.last_breakdown))
