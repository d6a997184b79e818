"""A simulated KV cache and runtime with the primitives of `evoke_engine.runtime.kv.KVCache`, in plain Python:
a simulation for benches and tests that proves nothing about llama.cpp.

Invariants, each raising `FakeKVViolation` when the engine breaks it: a sequence holds at most one cell
per position; a decode appends at the sequence's tail (`pos_max + 1`); a saved range has no holes; bytes
are never saved from cells with a pending shift; no cell position goes negative; the scratch sequence is
empty between calls.

What it owns: the cells of one unified context (a token id, one position, the sequences holding it, and the
position its K row was rotated for), a toy word-level vocabulary, and byte payloads (`SavedKV`) in the layout
of llama.cpp's one-sequence state (one layer whose K and V rows are the cells' token ids), so a test can check that
a restore brings back exactly the evicted tokens at the positions it asked for, and a KV file written over the
simulator passes the engine's file checks.

What it is for: the engine's OWN logic (eviction order, positions, parking, forking, recovery choice,
the reply split) without a model, a whole `Engine` on the simulated backend built on it (tests/helpers/
sim_backend.py), and the model-free retrieval bench (`bench retrieval`). It imports no llama_cpp. It is not
llama.cpp: it follows the facts DESIGN.md measured on the real library (a cell has one position, so shifting
a cell two sequences share moves it for both; a K-shift stays pending until the next decode; bytes are saved
only after it is applied) and is stricter than llama.cpp where a misuse would be silent there.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from evoke_engine.errors import Cancelled, DecodeError, RestoreError
from evoke_engine.runtime.decode_pace import DecodePace
from evoke_engine.runtime.held_ahead import HeldAhead
from evoke_engine.runtime.saved_kv import SavedKV

# Saved bytes follow the layout of llama.cpp's one-sequence state (what `KVCache.save` returns and the engine's
# checks, KV files and `state_cells.cut` walk): one stream, each cell's position and sequence, then one layer
# whose K and V rows are the cell's token id (GGML_TYPE_I32): a KV file the simulator writes passes the checks
# a real one does, and a restore brings back exactly the saved tokens.
MAGIC = int.from_bytes(b"FKV2", "little")
_VERSION = 1
_HEADER = struct.Struct("<IIII")        # magic, version, n_stream (1), n_cells
_CELL = struct.Struct("<iIi")           # position, n_seq (1), sequence id
_LAYERS = struct.Struct("<II")          # v_trans (0), n_layer (1)
_ROW = struct.Struct("<iQ")             # type, bytes per cell
GGML_TYPE_I32 = 26
_TOKEN = struct.Struct("<i")
_FAR = 1 << 30


class FakeKVViolation(AssertionError):
    """The engine used the cache in a way llama.cpp would corrupt silently (or refuse)."""


@dataclass(eq=False)
class Cell:
    token: int
    pos: int
    k_pos: int                          # the position its K row is rotated for: != pos while a shift is pending
    seqs: set[int] = field(default_factory=set)


def _span(p0: int, p1: int) -> tuple[int, int]:
    """llama.cpp's range convention: a negative bound is open."""
    return (0 if p0 < 0 else p0), (_FAR if p1 < 0 else p1)


class FakeCells:
    """The cells of one context; `n_cells` plays n_ctx (a decode or restore past it fails)."""

    def __init__(self, n_cells: int = 1 << 16) -> None:
        self.n_cells = n_cells
        self.cells: list[Cell] = []

    def of(self, seq: int, p0: int = -1, p1: int = -1) -> list[Cell]:
        lo, hi = _span(p0, p1)
        return sorted((c for c in self.cells if seq in c.seqs and lo <= c.pos < hi), key=lambda c: c.pos)

    def free(self) -> int:
        return self.n_cells - len(self.cells)

    def add(self, seq: int, pos: int, token: int, k_pos: int | None = None) -> Cell:
        if self.of(seq, pos, pos + 1):
            raise FakeKVViolation(f"seq {seq} already holds a cell at position {pos}")
        cell = Cell(token=token, pos=pos, k_pos=pos if k_pos is None else k_pos, seqs={seq})
        self.cells.append(cell)
        return cell

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        for cell in self.of(seq, p0, p1):
            cell.seqs.discard(seq)
        self.cells = [c for c in self.cells if c.seqs]
        return True

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        for cell in self.of(seq, p0, p1):        # one position per cell: it moves for every sequence holding it
            if cell.pos + delta < 0:
                raise FakeKVViolation(f"seq {seq}: a cell at {cell.pos} shifted by {delta} goes negative")
            cell.pos += delta
        self._check_unique()

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        taken = {c.pos for c in self.of(dst)}
        for cell in self.of(src, p0, p1):
            if cell.pos in taken and dst not in cell.seqs:
                raise FakeKVViolation(f"seq {dst} already holds a cell at position {cell.pos}")
            cell.seqs.add(dst)

    def apply_shifts(self) -> None:
        for cell in self.cells:
            cell.k_pos = cell.pos

    def pending(self) -> list[Cell]:
        return [c for c in self.cells if c.k_pos != c.pos]

    def _check_unique(self) -> None:
        seen: set[tuple[int, int]] = set()
        for cell in self.cells:
            for seq in cell.seqs:
                if (seq, cell.pos) in seen:
                    raise FakeKVViolation(f"seq {seq} holds two cells at position {cell.pos}")
                seen.add((seq, cell.pos))


class ToyVocab:
    """Words (with their trailing whitespace) get ids on first sight; `<|name|>` is one special token when
    special parsing is on. Detokenizing gives the text back exactly."""

    SPECIAL = re.compile(r"<\|[a-z_]+\|>")
    WORD = re.compile(r"\S+\s*|\s+")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.ids: dict[str, int] = {}
        self._lock = threading.Lock()            # the endpoint counts tokens off the engine thread
        self.bos = self.id_of("<|bos|>")
        self.eos = self.id_of("<|eos|>")

    def id_of(self, piece: str) -> int:
        known = self.ids.get(piece)
        if known is not None:
            return known
        with self._lock:
            if piece not in self.ids:
                self.ids[piece] = len(self.pieces)
                self.pieces.append(piece)
            return self.ids[piece]

    def tokenize(self, text: str, parse_special: bool = True) -> list[int]:
        tokens: list[int] = []
        cursor = 0
        specials = list(self.SPECIAL.finditer(text)) if parse_special else []
        for match in specials:
            tokens += [self.id_of(w) for w in self.WORD.findall(text[cursor:match.start()])]
            tokens.append(self.id_of(match.group()))
            cursor = match.end()
        tokens += [self.id_of(w) for w in self.WORD.findall(text[cursor:])]
        return tokens

    def words(self, n: int, tag: str) -> str:
        """`n` distinct words tagged `tag` (each one token): text of a known length."""
        return " ".join(f"{tag}{i}" for i in range(n)) + " "


class FakeRuntime:
    """The little of `evoke_engine.runtime.runtime.Runtime` that ConversationMemory and a turn use: decode appends
    cells (and applies pending shifts, as a real decode does); tokenize on a toy vocabulary; no logits."""

    eviction_supported = True
    eviction_note = ""
    n_contexts = 1
    slots_share_cells = True                      # the unified layout: the slots and the prefix in one cache
    slot_runs_batch = False                       # so no slot is better placed than another for a step
    steps_shared = True

    def __init__(self, *, slots: int = 4, n_cells: int = 1 << 16) -> None:
        self.cells = FakeCells(n_cells)
        self.vocab = ToyVocab()
        self.scratch_seq = slots + 1              # slots, one prefix sequence, then the scratch
        self.completion_seq = slots + 2           # and a raw completion's
        self.decoded: list[tuple[int, int, int]] = []    # (seq, start position, tokens) of every decode
        self.pace = DecodePace()                  # no decode is timed here: prefill steps stay at their cap

    @property
    def n_vocab(self) -> int:
        return len(self.vocab.pieces)

    @property
    def flush_token(self) -> int:
        """The token a flush decodes into the scratch sequence to apply pending shifts."""
        return self.vocab.bos

    def context_of(self, seq: int) -> int:
        return 0

    def ctx(self, context: int) -> None:
        return None

    def _check_thread(self) -> None:
        return None

    def step_boundary(self) -> None:
        """Where a reply lets others run (`Runtime.step_boundary`); the engine installs its own."""

    def token_boundary(self) -> None:
        """The step boundary before a reply's next token (`Runtime.token_boundary`); the engine installs its own."""
        self.step_boundary()

    def boundary_if_spent(self) -> None:
        """The step boundary once a step has taken a token step's time (`Runtime.boundary_if_spent`); the engine
        installs its own."""
        self.step_boundary()

    def decode(self, tokens: list[int], seq: int, start_pos: int, *, logits_last: bool = True,
               cancel: threading.Event | None = None, on_chunk=None, context: int | None = None,
               chunk: int = 0) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        tail = max((c.pos for c in self.cells.of(seq)), default=-1) + 1
        if tokens and start_pos != tail:
            raise FakeKVViolation(f"decode into seq {seq} at {start_pos}, its tail is {tail}")
        if len(tokens) > self.cells.free():
            raise DecodeError(1, self.cells.n_cells)
        self.cells.apply_shifts()
        for i, token in enumerate(tokens):
            self.cells.add(seq, start_pos + i, token)
        self.decoded.append((seq, start_pos, len(tokens)))
        if on_chunk is not None:
            on_chunk(len(tokens))

    def decoded_into(self, seq: int) -> int:
        """Tokens decoded into `seq` so far (a restore decodes none)."""
        return sum(n for s, _, n in self.decoded if s == seq)

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, parse_special)

    def tokenize_parts(self, parts: Iterable[tuple[str, bool]]) -> list[int]:
        return [t for text, special in parts if text for t in self.tokenize(text, parse_special=special)]

    def token_bytes(self, token: int) -> bytes:
        return self.vocab.pieces[token].encode()

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(self.vocab.pieces[t] for t in tokens)

    def is_eog(self, token: int) -> bool:
        return token == self.vocab.eos


def pack(cells: list[Cell], origin: int) -> bytearray:
    """The state bytes of `cells` (which hold positions origin.. once each)."""
    if sorted(c.pos for c in cells) != list(range(origin, origin + len(cells))):
        raise FakeKVViolation(f"packing cells at {[c.pos for c in cells]} from origin {origin}")
    data = bytearray(_HEADER.pack(MAGIC, _VERSION, 1, len(cells)))
    for cell in cells:
        data += _CELL.pack(cell.pos, 1, 0)
    data += _LAYERS.pack(0, 1)
    for _ in ("K", "V"):
        data += _ROW.pack(GGML_TYPE_I32, _TOKEN.size)
        for cell in cells:
            data += _TOKEN.pack(cell.token)
    return data


def unpack(data: bytes | bytearray | memoryview) -> tuple[int, list[tuple[int, int]]]:
    """(origin, [(position, token)]) of a payload; RestoreError for bytes that are not one."""
    raw = bytes(data)
    try:
        magic, version, n_stream, n = _HEADER.unpack_from(raw)
        if magic != MAGIC or version != _VERSION or n_stream != 1 or n < 1:
            raise RestoreError("fake KV: bytes from another model")
        positions = [_CELL.unpack_from(raw, _HEADER.size + i * _CELL.size)[0] for i in range(n)]
        offset = _HEADER.size + n * _CELL.size + _LAYERS.size + _ROW.size
        tokens = [_TOKEN.unpack_from(raw, offset + i * _TOKEN.size)[0] for i in range(n)]
    except struct.error as exc:
        raise RestoreError(f"fake KV: truncated payload ({exc})") from exc
    if len(raw) != offset + n * _TOKEN.size + _ROW.size + n * _TOKEN.size:
        raise RestoreError("fake KV: payload of the wrong length")
    return min(positions), list(zip(positions, tokens, strict=True))


class FakeKVCache:
    """`KVCache`'s public surface over `FakeCells` (same names, parameters and held-ahead rules)."""

    def __init__(self, runtime: FakeRuntime, *, mirror=None) -> None:
        self.rt = runtime
        self.cells = runtime.cells
        self.mirror = mirror
        self.scratch = runtime.scratch_seq
        self._shifted = False
        self.shift_flushes = 0
        self.native_reanchors = 0
        self.geometry = None
        self.reanchor_note = "fake KV cache: no native re-anchor"
        self.ahead = HeldAhead(lambda seq, p0: self.cells.seq_rm(seq, p0, -1), move=self._move_up)
        self.saves = self.restores = self.evictions = 0
        self.reject_restores = 0                 # the next N restores fail as llama.cpp refusing them does

    # -- what tests read ------------------------------------------------------------------------
    def tokens(self, seq: int) -> list[int]:
        return [c.token for c in self.cells.of(seq)]

    def positions(self, seq: int) -> list[int]:
        return [c.pos for c in self.cells.of(seq)]

    def layout(self, seq: int) -> list[tuple[int, int]]:
        return [(c.pos, c.token) for c in self.cells.of(seq)]

    # -- queries ----------------------------------------------------------------------------
    def pos_max(self, seq: int) -> int:
        return max((c.pos for c in self.cells.of(seq)), default=-1)

    def pos_min(self, seq: int) -> int:
        return min((c.pos for c in self.cells.of(seq)), default=-1)

    def same_cells(self, a: int, b: int) -> bool:
        return True

    @property
    def shift_pending(self) -> bool:
        return self._shifted

    @shift_pending.setter
    def shift_pending(self, pending: bool) -> None:
        self._shifted = pending

    # -- tokens decoded ahead (KVCache's own `HeldAhead` rules) ----------------------------------
    @property
    def ahead_claimed(self) -> int:
        return self.ahead.claimed

    def ahead_tokens(self, seq: int) -> int:
        return len(self.ahead.tokens(seq))

    def held_ahead(self, seq: int) -> list[int]:
        return self.ahead.tokens(seq)

    def ahead_opening(self, seq: int) -> int:
        return self.ahead.opening(seq)

    def hold_ahead(self, seq: int, pos: int, tokens: list[int], *, opening: int = 0) -> None:
        self.ahead.hold(seq, pos, tokens, opening=opening)

    def _move_up(self, seq: int, p0: int, delta: int) -> None:
        self.cells.seq_add(seq, p0, -1, delta)
        self._shifted = True

    def claim_ahead(self, seq: int, pos: int, tokens: list[int], *, whole: bool = False) -> int:
        return self.ahead.claim(seq, pos, tokens, whole=whole)

    # -- primitives -------------------------------------------------------------------------
    def save_deferred(self, seq: int, p0: int, p1: int) -> SavedKV:
        """`save` (the fake cache copies nothing on a worker: its bytes are whole at once)."""
        return self.save(seq, p0, p1)

    def save(self, seq: int, p0: int, p1: int) -> SavedKV:
        if p1 <= p0:
            raise ValueError(f"empty range [{p0}, {p1})")
        self._flush()
        cells = self.cells.of(seq, p0, p1)
        if [c.pos for c in cells] != list(range(p0, p1)):
            raise FakeKVViolation(f"saving [{p0}, {p1}) of seq {seq}: cells at {[c.pos for c in cells]}")
        if any(c.k_pos != c.pos for c in cells):
            raise FakeKVViolation("saving cells with a pending K-shift")
        self.saves += 1
        return SavedKV(data=pack(cells, p0), origin_pos=p0, n_tokens=p1 - p0)

    def evict(self, seq: int, p0: int, p1: int, *, compact: bool = True) -> None:
        self.ahead.evicted(seq, p0, p1, compact=compact)
        self.cells.seq_rm(seq, p0, p1)
        self.evictions += 1
        if compact and self.pos_max(seq) >= p1:
            self.cells.seq_add(seq, p1, -1, -(p1 - p0))
            self._shifted = True

    def evict_ranges(self, seq: int, ranges: list[tuple[int, int]]) -> None:
        for p0, p1 in sorted(ranges, reverse=True):
            self.evict(seq, p0, p1)

    def restore(self, saved: SavedKV, seq: int, at_pos: int, *, before_opening: bool = False) -> None:
        if before_opening:                                   # KVCache's rule on a host cache: the opening moves
            self.ahead.make_room(seq, at_pos, saved.n_tokens)
        else:
            self.ahead.forget(seq)
        try:
            self._restore_at(saved, seq, at_pos)
        except BaseException:
            self.ahead.forget(seq)
            raise

    def _restore_at(self, saved: SavedKV, seq: int, at_pos: int) -> None:
        if self.reject_restores:
            self.reject_restores -= 1
            raise RestoreError(f"llama.cpp rejected {saved.n_tokens} saved tokens (fake: told to refuse)")
        origin, cells = unpack(saved.data)
        if origin != saved.origin_pos:
            raise RestoreError("fake KV: payload origin differs from SavedKV.origin_pos")
        if len(cells) > self.cells.free():
            raise RestoreError(f"llama.cpp rejected {saved.n_tokens} saved tokens (no free cells)")
        delta = at_pos - origin
        for pos, token in cells:                 # restored at their original rotation, the shift pending
            self.cells.add(seq, pos + delta, token, k_pos=pos)
        if delta:
            self._shifted = True
        self.restores += 1

    def share(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.ahead.shared(src, dst, p1)
        self.cells.seq_cp(src, dst, p0, p1)

    def drop(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        self.ahead.forget(seq)
        self.cells.seq_rm(seq, p0, p1)

    def flush_pending_shifts(self, via_seq: int | None = None) -> None:
        self._flush(via_seq)

    def _flush(self, via_seq: int | None = None) -> None:
        if not self._shifted:
            return
        seq = self.scratch if via_seq is None else via_seq
        if self.cells.of(seq):
            raise FakeKVViolation(f"flushing shifts through seq {seq}, which is not empty")
        self.rt.decode([self.rt.flush_token], seq, 0, logits_last=False)
        self.cells.seq_rm(seq, -1, -1)
        self._shifted = False
        self.shift_flushes += 1
