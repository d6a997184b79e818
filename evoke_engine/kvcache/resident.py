"""The resident sequence of one conversation: its slot's llama.cpp cells, its block table and its pool entries.

Invariants: the only writer of block positions and states and of the slot's cells; resident blocks sit at
[0, active_tokens) in table order and the slot holds exactly them (plus the opening held ahead); a block out
of the context is RAM or DISK exactly while the pool holds its bytes for this sequence (`bytes_moved`
follows the pool), else DROPPED; victims are saved before any cell moves; cells a forked sibling shares are
copied out before they move; shared (prefix) cells never move. It decides nothing: `ConversationMemory` does.
While `exact` (every resident cell is what a fresh decode of the resident tokens from position 0 gives), blocks it
decodes or splices exactly are published in the shared `ChunkIndex`; blocks whose cells move are forgotten there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..errors import InvariantError, RestoreError
from ..runtime.kv import KVPrimitives, SavedKV
from ..runtime.runtime import Runtime
from .blocks import Block, BlockState, BlockTable
from .chunk_index import ChunkIndex, ChunkSource, chain_hash, chain_of
from .pool import SavedPool

if TYPE_CHECKING:
    from .prefixes import Prefix, SharedPrefixes

SavedBytes = tuple[bytes, int, int]          # (bytes, origin_pos, n_tokens): a snapshot's saved K/V


def _writable(data) -> bytearray | memoryview:
    """A buffer llama.cpp can read from without a copy (copies only read-only input)."""
    if isinstance(data, memoryview) and not data.readonly or isinstance(data, bytearray):
        return data
    return bytearray(data)


class ResidentSequence:
    """Mechanism for one conversation: append, take out (with or without bytes), splice back at the tail,
    remove for good, park and unpark, share into a fork. Every method keeps the table and the cells equal."""

    def __init__(self, *, runtime: Runtime, kv: KVPrimitives, pool: SavedPool,
                 index: ChunkIndex | None = None, label: str = "") -> None:
        self.rt, self.kv, self.pool = runtime, kv, pool
        self.label = label                       # the conversation's id, for events saying where K/V came from
        self.index = index                       # decoded chunks of every open conversation (shared)
        self.exact = True                        # resident cells == a fresh decode of the resident tokens
        self.table = BlockTable()
        self.seq: int | None = None              # the llama.cpp sequence (slot) while in one
        self.image: Block | None = None          # the slot's bytes while parked
        self.image_ahead: list[int] = []         # the opening held ahead, the image's last cells
        self.image_opening = 0                   # how many of them are the template's role header

    # -- reading ----------------------------------------------------------------------------
    @property
    def active_tokens(self) -> int:
        return self.table.active_tokens

    @property
    def prefix_tokens(self) -> int:
        return sum(b.n_tokens for b in self.table.resident if b.shared)

    def location(self) -> str:
        """Where the conversation's own cells are: slot, ram, disk (the parked image) or none."""
        if self.seq is not None:
            return "slot"
        if self.image is None:
            return "none"
        return "disk" if self.image.state is BlockState.DISK else "ram"

    # -- the chunk index ---------------------------------------------------------------------
    def chain_key(self, block: Block) -> str:
        """The prefix hash `block` would have appended at the tail now (resident tokens, then its own)."""
        return chain_hash(chain_of(self.table.resident), block.tokens)

    def _publish(self, blocks: Sequence[Block]) -> None:
        """Register resident `blocks` (decoded or spliced exactly) in the index while the sequence is exact."""
        if self.index is None or not self.exact or self.seq is None:
            return
        wanted = {b for b in blocks if b.role not in ("assistant", "image")}
        key = ""
        for block in self.table.resident:
            key = chain_hash(key, block.tokens)
            if block in wanted:
                self.index.register(key, self, block)

    def _moved(self, blocks: Iterable[Block], *, exact: bool = False) -> None:
        """`blocks` leave their cells or positions: their index entries go; unless `exact`, the cells left are no
        longer a fresh decode of the resident tokens, so nothing more is published."""
        self.exact = self.exact and exact
        if self.index is not None:
            self.index.forget(self, blocks)

    def lookup(self, block: Block, *, approximate: bool = False, prefer: ResidentSequence | None = None,
               following: Sequence[Block] = (), owner: str | None = None) -> ChunkSource | None:
        """Another conversation's exact K/V for `block` appended at the tail now (`following`: the blocks meant to
        come after it, which weigh whether a KV file is worth reading); else, with `approximate`, the K/V of the
        same tokens after another prefix held in a slot; or None. With `owner`, only a conversation of that owner's
        (`ChunkIndex.owner_of`) is a source."""
        if self.index is None or self.seq is None:
            return None
        key = self.chain_key(block)

        def later_keys():                        # hashed only as far as a KV file's run needs them
            later = key
            for after in following:
                later = chain_hash(later, after.tokens)
                yield later
        found = self.index.lookup(key, exclude=self, following=later_keys(), owner=owner)
        if found is None and approximate:
            found = self.index.lookup_content(block.hash, exclude=self, prefer=prefer, owner=owner)
            if found is not None and found.where != "slot":
                return None                      # a part of pool bytes is not spliced: only slot cells
        return found

    def splice(self, block: Block, source: ChunkSource, *, repair_tokens: int = 0) -> None:
        """Append `block` at the tail from `source`'s K/V: another slot's cells or the pool's bytes. An exact source
        sits at the same positions (no forward pass, no re-anchor); an approximate one is re-anchored, after its
        first `repair_tokens` are decoded afresh after the seam (they attend to this conversation), and the
        sequence is no longer exact. RestoreError: nothing changed (the caller decodes instead)."""
        at, n = self.active_tokens, block.n_tokens
        if source.n_tokens != n or source.exact and source.origin != at:
            raise InvariantError(f"{block.name}: a source at {source.origin} for the tail at {at}")
        if not source.exact and (source.where != "slot" or repair_tokens >= n):
            raise InvariantError(f"{block.name}: an approximate splice takes part of slot cells")
        skip = 0 if source.exact else max(0, repair_tokens)
        if source.where == "slot":
            saved = self.kv.save(source.owner.seq, source.origin + skip, source.origin + n)
        elif source.where == "file":
            saved = self._file_bytes(source)
        else:
            try:
                data, origin, n_tokens = self.pool.peek_bytes(source.block)
            except OSError as exc:
                raise RestoreError(f"the spill file of {source.block.name} is unreadable: {exc}") from exc
            saved = SavedKV(bytearray(data), origin, n_tokens)
        try:
            if skip:
                self._decode_at_tail(block.tokens[:skip], logits_last=False)
            self.kv.restore(saved, self.seq, at + skip)
        except BaseException:
            self.kv.drop(self.seq, at, -1)
            raise
        self.table.append(block)
        if source.exact:
            self._publish([block])
        else:
            self.exact = False

    def _file_bytes(self, source: ChunkSource) -> SavedKV:
        """The K/V of a file source (RestoreError: the file no longer has them, and the index forgets it)."""
        files = self.index.files if self.index is not None else None
        if files is None:
            raise RestoreError(f"{source.block_name}: no KV files to read")
        try:
            saved = files.read(source.key, source.file)
        except RestoreError:
            self.index.forget_file(source.file.conversation_id)
            raise
        if saved.origin_pos != source.origin or saved.n_tokens != source.n_tokens:
            raise InvariantError(f"{source.block_name}: the file gave {saved.n_tokens} tokens at {saved.origin_pos}")
        return saved

    def chunk_records(self) -> dict[int, tuple[str, int]]:
        """Block index (birth order) -> (chain key, origin) of this sequence's blocks the index holds exactly now
        (in the slot or its parked image at their position, or full-width in the pool): what a KV file written
        now can offer other conversations."""
        if self.index is None:
            return {}
        where = {id(block): (key, origin) for key, block, origin in self.index.entries_of(self)}
        return {i: where[id(b)] for i, b in enumerate(self.table.blocks) if id(b) in where}

    def _adopt_records(self, records: dict[int, tuple[str, int]]) -> bool:
        """Register a loaded snapshot's exact blocks again: a resident one whose position and recomputed chain
        agree with its record (its cells come back byte for byte with the image), a saved one whose full-width
        bytes the pool holds at its recorded origin. False when a resident one does not check out."""
        if self.index is None:
            return False
        key = ""
        chains = {}
        for block in self.table.resident:
            key = chain_hash(key, block.tokens)
            chains[id(block)] = key
        agree = True
        for index, (key, origin) in records.items():
            if not 0 <= index < len(self.table.blocks):
                agree = False
                continue
            block = self.table.blocks[index]
            if block.state is BlockState.RESIDENT:
                if block.pos != origin or chains.get(id(block)) != key:
                    agree = False
                    continue
                self.index.register(key, self, block)
            elif self.pool.holds_exact(block, origin):
                self.index.register(key, self, block, origin)
        return agree

    # -- the pool's reports -----------------------------------------------------------------
    def bytes_moved(self, block: Block, where: BlockState) -> None:
        """The pool moved the bytes of one of this sequence's blocks (spilled, or dropped for room)."""
        if block is self.image:
            block.state = where
        else:
            self.table.mark_bytes(block, where)

    def _hold(self, block: Block, saved: SavedKV) -> None:
        """The pool holds the bytes of `block` (out of the context) for this sequence; its state says where."""
        self.bytes_moved(block, self.pool.put(block, saved, self))

    # -- building a table out of a slot ------------------------------------------------------
    def adopt_prefix(self, blocks: Iterable[Block]) -> None:
        """A fresh sequence, out of any slot, starts with the shared prefix's blocks (at positions 0..)."""
        if self.table.blocks or self.seq is not None:
            raise InvariantError("the prefix is adopted by a fresh sequence, out of any slot")
        for block in blocks:
            self.table.append(block)

    def load(self, blocks: list[Block], saved: dict[int, SavedBytes], image: SavedBytes | None, ahead: list[int],
             turn: int, chunks: dict[int, tuple[str, int]] | None = None, exact: bool = False,
             opening: int = 0) -> None:
        """Adopt a snapshot's blocks (birth order) out of a slot: saved bytes (by block index) go to the pool,
        blocks out of the context without any are DROPPED; `image` is parked for `unpark`; `chunks` (the
        snapshot's exact blocks, `chunk_records`) go back into the index where they still check out, and the
        sequence is `exact` as the snapshot says when they all do (the image comes back byte for byte at its
        positions; a file that does not say is not known to be)."""
        if self.seq is not None or self.table.blocks:
            raise InvariantError("a snapshot is loaded into a fresh sequence, out of any slot")
        self.table = BlockTable.from_blocks(blocks)
        self.exact = False
        for index, block in enumerate(self.table.blocks):
            if block.state is BlockState.RESIDENT:
                continue
            if index in saved:
                data, origin, n_tokens = saved[index]
                self._hold(block, SavedKV(_writable(data), origin, n_tokens))
            else:
                self.table.mark_bytes(block, BlockState.DROPPED)
        self.table.check()
        if image is not None:
            data, origin, n_tokens = image
            self.image = Block(name="slot-image", role="image", turn=turn, tokens=[], text="")
            self._hold(self.image, SavedKV(_writable(data), origin, n_tokens))
            self.image_ahead, self.image_opening = list(ahead), opening
        self.exact = self._adopt_records(chunks or {}) and exact

    # -- decoding at the tail ----------------------------------------------------------------
    def _decode_at_tail(self, tokens: list[int], *, ahead: Sequence[int] = (), logits_last: bool = True,
                        cancel=None) -> None:
        """Decode `tokens` after the last block. Leading tokens already decoded there ahead of time are not
        decoded again; `ahead` (the opening the next message will start with) goes into the same llama_decode
        after them and is held outside the table, its few cells outside the budget, until a decode claims it
        or any other operation drops it."""
        if ahead and logits_last:
            raise ValueError("tokens decoded ahead come after the last logits wanted")
        start = self.active_tokens
        done = self.kv.claim_ahead(self.seq, start, tokens, whole=not logits_last)
        self.rt.decode([*tokens[done:], *ahead], self.seq, start + done, logits_last=logits_last, cancel=cancel)
        if ahead:
            self.kv.hold_ahead(self.seq, start + len(tokens), list(ahead), opening=len(ahead))

    def decode_ahead(self, tokens: Sequence[int]) -> int:
        """Decode `tokens`, the start of a message not sent yet (a draft the user paused on), at the tail and hold
        them there outside the table as the next message's opening is held: the decode that starts with them
        claims them (`_decode_at_tail`), any other operation drops them. A held run that `tokens` extend is kept
        (typing on decodes only what was added). Returns the tokens decoded now; a failed decode holds nothing."""
        tokens, start = list(tokens), self.active_tokens
        opening = self.kv.ahead_opening(self.seq)
        done = self.kv.claim_ahead(self.seq, start, tokens, whole=True) if tokens else 0
        try:
            if done < len(tokens):
                self.rt.decode(tokens[done:], self.seq, start + done, logits_last=False)
        except BaseException:
            self.kv.drop(self.seq, start, -1)
            raise
        self.kv.hold_ahead(self.seq, start, tokens, opening=min(opening, done))  # the draft's words are no opening
        return len(tokens) - done

    def append(self, blocks: Sequence[Block], *, logits_last: bool = True, cancel=None) -> None:
        """Decode the tokens of new `blocks` at the tail in one call and add them to the table. A decode that
        fails (or is cancelled) leaves nothing behind: the cells decoded before it drop with it."""
        try:
            self._decode_at_tail([t for block in blocks for t in block.tokens], logits_last=logits_last,
                                 cancel=cancel)
        except BaseException:
            self.kv.drop(self.seq, self.active_tokens, -1)
            raise
        for block in blocks:
            self.table.append(block)
        self._publish(blocks)

    def extend_tail(self, block: Block, tokens: list[int], *, ahead: Sequence[int] = (),
                    logits_last: bool = True) -> None:
        """Decode `tokens` at the tail as more of `block`, the last resident block (a reply growing);
        `ahead` as in `_decode_at_tail`. Nothing to decode does nothing."""
        if not self.table.resident or self.table.resident[-1] is not block:
            raise InvariantError(f"{block.name} is not the last resident block")
        if not tokens and not ahead:
            return
        self._decode_at_tail(tokens, ahead=ahead, logits_last=logits_last)
        block.tokens.extend(tokens)

    def take_back(self, block: Block, n_tokens: int) -> None:
        """Forget the last `n_tokens` of `block`, the last resident block (a reply that a stop string ended: the
        stop's start leaves its cells and its tokens); the tail shrinks, no other cell moves."""
        if not self.table.resident or self.table.resident[-1] is not block:
            raise InvariantError(f"{block.name} is not the last resident block")
        if not 0 <= n_tokens <= block.n_tokens:
            raise InvariantError(f"{block.name} holds {block.n_tokens} tokens, not {n_tokens} to take back")
        if n_tokens:
            self.kv.drop(self.seq, block.end - n_tokens, -1)
            del block.tokens[block.n_tokens - n_tokens:]

    def split(self, block: Block, pieces: list[Block]) -> None:
        """Replace resident `block` by `pieces` holding its tokens in order (no cell changes)."""
        self.table.split(block, pieces)

    def flush_pending_shifts(self) -> None:
        """Apply the K-shifts that evictions queued (positions do not change; the next decode pays less)."""
        self.kv.flush_pending_shifts()

    # -- taking blocks out -------------------------------------------------------------------
    def evict(self, victims: Iterable[Block], *, keep_bytes: bool) -> list[Block]:
        """Take resident `victims` out of the context, later blocks moving down; with `keep_bytes` their K/V go
        to the pool first (every one saved before any cell moves), else they are DROPPED. Returns them in the
        order they left (last first)."""
        victims = list(victims)
        if any(b.shared for b in victims):
            raise InvariantError("shared prefix blocks never leave the context")
        # the rows copy on a worker while the engine goes on (KVCache.save_deferred; the fake cache saves at once)
        saved = ({block: self.kv.save_deferred(self.seq, block.pos, block.end) for block in victims}
                 if keep_bytes else {})
        if victims:
            first = min(b.pos for b in victims)
            self._unshare_from(first, leaving=victims)
            leaving = set(victims)
            moved = [b for b in self.table.resident if b.pos > first and b not in leaving]
            self._moved(moved, exact=not moved)
            if not keep_bytes:
                self._moved(victims)
        order = sorted(victims, key=lambda b: b.pos, reverse=True)
        self.kv.evict_ranges(self.seq, _runs(order))
        for block in order:
            self.table.remove_resident(block, BlockState.DROPPED)
            if keep_bytes:
                self._hold(block, saved[block])
        return order

    def remove(self, doomed: Iterable[Block]) -> None:
        """Take blocks out of the conversation for good (their message was edited away or deleted):
        resident ones leave the sequence (later ones move down), saved ones leave the pool."""
        doomed = list(doomed)
        if any(b.shared for b in doomed):
            raise ValueError("the shared prefix cannot be removed from a conversation")
        resident = sorted((b for b in doomed if b.state is BlockState.RESIDENT), key=lambda b: b.pos)
        if resident and self.seq is None:
            raise ValueError("a parked conversation's blocks are removed after it is back in its slot")
        self._moved(doomed, exact=True)
        if resident:
            leaving = set(resident)
            first = resident[0].pos
            self._moved([b for b in self.table.resident if b.pos > first and b not in leaving],
                        exact=all(b in leaving for b in self.table.resident if b.pos >= first))
            if all(b in leaving for b in self.table.resident if b.pos >= first):
                self.kv.drop(self.seq, first, -1)        # the tail: no cell moves
                for block in reversed(resident):
                    self.table.remove_resident(block, BlockState.DROPPED)
            else:
                self._unshare_from(first, leaving=resident)
                for block in reversed(resident):
                    self.kv.evict(self.seq, block.pos, block.end)
                    self.table.remove_resident(block, BlockState.DROPPED)
        for block in doomed:
            self.pool.discard(block)
            self.table.forget(block)

    def _unshare_from(self, pos: int, *, leaving: Iterable[Block] = ()) -> None:
        """Give this sequence private copies of the cells at and after `pos` that a forked sibling may
        share, before they move: a cell has one position, so shifting a shared one moves it for both."""
        leaving = set(leaving)
        shared = [b for b in self.table.resident if b.sibling_shared and b.pos >= pos and b not in leaving]
        if not shared:
            return
        start = min(b.pos for b in shared)
        copy = self.kv.save(self.seq, start, self.active_tokens)
        self.kv.drop(self.seq, start, -1)                # the sibling keeps its cells
        self.kv.restore(copy, self.seq, start)
        self.table.mark_private(from_pos=start)

    # -- bringing saved bytes back ----------------------------------------------------------
    def restore(self, block: Block) -> None:
        """Splice a saved block's K/V back at the tail (RoPE re-anchor, no forward pass). RestoreError: the
        block stays saved when the splice failed, or is DROPPED when its bytes are gone."""
        self._moved([block])                              # re-anchored: near, not equal, to a fresh decode
        try:
            saved = self.pool.take(block)
        except RestoreError:
            self.table.mark_bytes(block, BlockState.DROPPED)
            raise
        try:
            self.kv.restore(saved, self.seq, self.active_tokens, before_opening=True)
        except RestoreError:
            self._hold(block, saved)                      # still saved; nothing is lost
            raise
        self.table.place_at_tail(block)

    # -- slot parking -----------------------------------------------------------------------
    def park(self, turn: int) -> None:
        """Leave the slot: the slot's own tokens are saved as one image; shared cells stay shared."""
        if self.seq is None:
            raise InvariantError("not in a slot: nothing to park")
        start = self.prefix_tokens
        ahead = self.kv.held_ahead(self.seq)
        if self.active_tokens > start:
            image = Block(name="slot-image", role="image", turn=turn,
                          tokens=[t for b in self.table.resident if not b.shared for t in b.tokens], text="")
            self.image, self.image_ahead = image, ahead
            self.image_opening = self.kv.ahead_opening(self.seq)
            self._hold(image, self.kv.save(self.seq, start, self.active_tokens + len(ahead)))
        self.kv.drop(self.seq)
        self.seq = None
        self.table.mark_private()                        # the image comes back into private cells

    def unpark(self, seq: int) -> None:
        """Into slot `seq`, whose prefix cells were already shared in: restore the image in place.
        Raises RestoreError when the image is lost (the caller rebuilds the conversation)."""
        if self.seq is not None:
            raise InvariantError(f"already in slot {self.seq}")
        self.seq = seq
        if self.image is not None:
            image, self.image = self.image, None
            (ahead, opening), self.image_ahead, self.image_opening = (self.image_ahead, self.image_opening), [], 0
            self.kv.restore(self.pool.take(image), seq, self.prefix_tokens)
            self.kv.hold_ahead(seq, self.active_tokens, ahead, opening=opening)

    def enter_slot(self, seq: int, prefixes: SharedPrefixes, prefix: Prefix) -> None:
        """Everything that puts this conversation into slot `seq`, in one place: the slot emptied, the prefix's
        cells shared in, the parked image restored in place (RestoreError when it is lost: the caller rebuilds),
        and for a new or emptied conversation the first user message's opening held ahead."""
        self.kv.drop(seq)
        prefixes.share_into(prefix, seq)
        self.unpark(seq)
        if not self.kv.ahead_tokens(seq) and all(b.shared for b in self.table.resident):
            prefixes.hold_opening(prefix, seq)

    # -- forks ------------------------------------------------------------------------------
    def share_into(self, child: ResidentSequence) -> None:
        """Make `child` (fresh, in its slot, prefix shared) hold this sequence's blocks: resident cells
        shared with this sequence (no decode, no copy), saved bytes shared in the pool."""
        if self.seq is None or child.seq is None or child.table.blocks != child.table.resident:
            raise ValueError("both conversations must be in slots, the child holding only its prefix")
        start = self.prefix_tokens
        if self.active_tokens > start:
            self.kv.share(self.seq, child.seq, start, self.active_tokens)
        self.table.mark_sibling_shared()
        copies = [block.clone() for block in self.table.blocks]
        child.table = BlockTable.from_blocks(copies)
        child.exact = False
        for block, copy in zip(self.table.blocks, copies, strict=True):
            if block.state is not BlockState.RESIDENT and block in self.pool:
                child.table.mark_bytes(copy, self.pool.share(block, copy, child))

    # -- persistence ------------------------------------------------------------------------
    def image_bytes(self) -> tuple[SavedBytes | None, list[int]]:
        """The conversation's own cells as one image (from the slot, or the parked image) and the opening
        held ahead after them; (None, []) when it holds nothing past the prefix."""
        if self.seq is not None:
            start = self.prefix_tokens
            if self.active_tokens <= start:
                return None, []
            ahead = self.kv.held_ahead(self.seq)
            saved = self.kv.save(self.seq, start, self.active_tokens + len(ahead))
            return (bytes(saved.data), saved.origin_pos, saved.n_tokens), ahead
        if self.image is not None:
            return self.pool.peek_bytes(self.image), self.image_ahead
        return None, []

    def ahead_opening(self) -> int:
        """How many tokens held ahead (in the slot, or after the parked image) are the template's role header."""
        if self.seq is not None:
            return self.kv.ahead_opening(self.seq)
        return self.image_opening if self.image is not None else 0

    def saved_bytes(self) -> dict[int, SavedBytes]:
        """The pool's bytes of the table's saved blocks, by block index (birth order), as the pool stores them
        (8- and 4-bit ones packed: a KV file holds them at the pool's size)."""
        return {i: self.pool.peek_stored(b) for i, b in enumerate(self.table.blocks) if b in self.pool}

    def release(self) -> None:
        """Forget every byte this sequence holds (slot cells and pool entries): saved blocks are DROPPED."""
        self._moved(self.table.blocks)
        if self.seq is not None:
            self.kv.drop(self.seq)
            self.seq = None
        for block in self.table.blocks:
            if block in self.pool:
                self.pool.discard(block)
                self.table.mark_bytes(block, BlockState.DROPPED)
        if self.image is not None:
            self.pool.discard(self.image)
        self.image, self.image_ahead, self.image_opening = None, [], 0

    def check(self) -> None:
        """The table is well formed, saved states follow the pool, and the slot holds exactly the table."""
        self.table.check()
        for block in self.table.blocks:
            held = self.pool.where(block)
            if held is not (block.state if block.state in (BlockState.RAM, BlockState.DISK) else None):
                raise InvariantError(f"{block.name} is {block.state.value} but the pool has its bytes in "
                                     f"{held.value if held else 'no tier'}")
        if self.seq is None:
            return
        ahead = self.kv.ahead_tokens(self.seq)
        if self.kv.pos_max(self.seq) != self.active_tokens + ahead - 1:
            raise InvariantError(f"pos_max {self.kv.pos_max(self.seq)} != active {self.active_tokens} "
                                 f"+ {ahead} held ahead - 1")


def _runs(blocks: Iterable[Block]) -> list[tuple[int, int]]:
    """The position ranges `blocks` cover, adjacent ones merged (one range per run of neighbours)."""
    runs: list[list[int]] = []
    for block in sorted(blocks, key=lambda b: b.pos):
        if runs and runs[-1][1] == block.pos:
            runs[-1][1] = block.end
        else:
            runs.append([block.pos, block.end])
    return [(p0, p1) for p0, p1 in runs]
