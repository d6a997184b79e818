"""KV primitives composed from the stock llama.cpp API: save, evict, restore, share.

Invariants: bytes are saved only from cells without a pending K-shift, and no decode starts with one: a pending
shift is applied first, on the CPU by the native rotation of only the moved cells' K rows (`_shift_natively`,
calibrated against llama.cpp's own shift; llama.cpp's K-shift graph rotates every cell of the cache, ~47 ms at 12K
cells here), elsewhere by a one-token decode in the scratch sequence of that context; the scratch sequence is
empty between calls; cells shared with a prefix sequence are never shifted or removed here; every
sequence operation runs in the context of the sequence it serves (`Runtime.context_of`) and goes through
`_seq_rm` / `_seq_add` / `_seq_cp`, which tell the `mirror` (the attention capture's K store, when there
is one) after llama.cpp did it. Sharing between two contexts, or two KV streams of one, copies the bytes (save,
then restore); the streams' context has no scratch sequence, so its blocks move by the direct path only.
Tokens held ahead of a sequence (`hold_ahead`) live only until the next operation on it: any but a
compaction below them drops them, an older block brought back at their start (`before_opening`) moves
their opening up past it where the K-shift that costs is cheap (the rest drops), and `claim_ahead` hands
them to the decode that was going to decode them anyway.

Bytes move by the direct path (`kv_direct`: the cells copied between the cache's tensors and host bytes, the
re-anchor fused with the copy on the CPU, llama.cpp's device K-shift elsewhere) where the native helper covers the
cache and its calibration on this model holds (the bytes equal llama.cpp's own serialisation, both ways); else,
and for any range it refuses, through llama.cpp's serialised state and the scratch sequence, as one log line says.
Both write and read the same bytes.
"""

from __future__ import annotations

import ctypes
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import llama_cpp as ll
import numpy as np

from ..errors import RestoreError
from . import host_arena, kv_direct, reanchor
from .held_ahead import HeldAhead
from .kv_direct import DirectError, DirectKV
from .runtime import Runtime
from .saved_kv import SavedKV  # noqa: F401 - re-exported: callers import it from kv

log = logging.getLogger(__name__)

_ROTATION_BUFFER_MAX = 16 << 20          # bytes: a block's K/V (a few hundred tokens) fits with room to spare


class SequenceMirror(Protocol):
    """Something that follows llama.cpp's sequence operations (attention.AttentionCapture)."""

    def seq_rm(self, seq: int, p0: int, p1: int) -> None: ...
    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None: ...
    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...
    def load_state(self, seq: int, blob: bytearray | memoryview) -> bool: ...


class KVPrimitives(Protocol):
    """The primitives a conversation's `ResidentSequence` calls (`KVCache`; kv_sim's `FakeKVCache` for the
    memory's own logic without a model: tests/unit checks both keep these signatures)."""

    mirror: SequenceMirror | None            # the attention capture's K store, when it is on

    def pos_max(self, seq: int) -> int: ...
    def ahead_tokens(self, seq: int) -> int: ...
    def held_ahead(self, seq: int) -> list[int]: ...
    def ahead_opening(self, seq: int) -> int: ...
    def hold_ahead(self, seq: int, pos: int, tokens: list[int], *, opening: int = 0) -> None: ...
    def claim_ahead(self, seq: int, pos: int, tokens: list[int], *, whole: bool = False) -> int: ...
    def save(self, seq: int, p0: int, p1: int) -> SavedKV: ...
    def save_deferred(self, seq: int, p0: int, p1: int) -> SavedKV: ...
    def evict(self, seq: int, p0: int, p1: int, *, compact: bool = True) -> None: ...
    def evict_ranges(self, seq: int, ranges: list[tuple[int, int]]) -> None: ...
    def restore(self, saved: SavedKV, seq: int, at_pos: int, *, before_opening: bool = False) -> None: ...
    def share(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...
    def drop(self, seq: int, p0: int = -1, p1: int = -1) -> None: ...
    def flush_pending_shifts(self, via_seq: int | None = None) -> None: ...


class KVCache:
    """Save / evict / restore / share over position ranges of sequences of one context."""

    def __init__(self, runtime: Runtime, *, mirror: SequenceMirror | None = None) -> None:
        self.rt = runtime
        self.mirror = mirror
        self.scratch = runtime.scratch_seq
        self._shifted: set[int] = set()                         # contexts with a K-shift queued
        self.shift_flushes = 0
        self.native_shifts = 0                                  # flushes done by the native rotation, no decode
        self.native_reanchors = 0
        self.geometry: reanchor.RopeGeometry | None = None
        self.reanchor_note = self._calibrate_native_reanchor()
        self.ahead = HeldAhead(lambda seq, p0: self._seq_rm(seq, p0, -1), move=self._move_up)
        self._rotation_buffer = bytearray()                     # reused: its pages are already the process's
        settings = runtime.settings
        self.use_direct = settings.kv_direct                   # False: always the serialised path
        self.arena = host_arena.configure_arena(settings.pool_pinned_share, pin=runtime.device.on_gpu,
                                                ram_budget_bytes=settings.ram_budget_bytes)
        self._direct: dict[int, DirectKV] = {}                  # by llama_context address
        self.direct_saves = self.direct_restores = self.deferred_saves = 0
        self._copier: ThreadPoolExecutor | None = None            # deferred saves' row copies, one at a time
        self._copying: list[Future] = []
        self._before_decode = runtime.before_decode
        runtime.before_decode = self._join_then_decode             # no decode writes cells a copy still reads
        self.direct_note = ""
        self.direct_note = self._calibrate_direct()
        if self.direct_note:
            log.info("KV blocks move through llama.cpp's serialised state: %s", self.direct_note)

    # -- queries ----------------------------------------------------------------------------
    def pos_max(self, seq: int) -> int:
        return ll.llama_memory_seq_pos_max(self._memory(seq), seq)

    def pos_min(self, seq: int) -> int:
        return ll.llama_memory_seq_pos_min(self._memory(seq), seq)

    def same_cells(self, a: int, b: int) -> bool:
        """Whether `b` can be given `a`'s cells by a sequence copy (one context, one KV stream)."""
        return self.rt.same_cells(a, b)

    @property
    def shift_pending(self) -> bool:
        return bool(self._shifted)

    @shift_pending.setter
    def shift_pending(self, pending: bool) -> None:
        self._shifted = set(range(len(self.rt.contexts))) if pending else set()

    # -- tokens decoded ahead of the message that will own them (`HeldAhead`'s rules) ----------
    @property
    def ahead_claimed(self) -> int:
        return self.ahead.claimed

    def ahead_tokens(self, seq: int) -> int:
        """Tokens decoded at the end of `seq` ahead of their owner (`hold_ahead`), 0 when none."""
        return len(self.ahead.tokens(seq))

    def held_ahead(self, seq: int) -> list[int]:
        return self.ahead.tokens(seq)

    def ahead_opening(self, seq: int) -> int:
        """How many leading held tokens of `seq` are the template's opening (`HeldAhead.opening`)."""
        return self.ahead.opening(seq)

    def hold_ahead(self, seq: int, pos: int, tokens: list[int], *, opening: int = 0) -> None:
        """Note that `tokens` were decoded at pos.. of `seq` (the cells after every block), before the
        message they open exists: the next decode at `pos` that starts with them skips them. The first
        `opening` of them are the template's role header: a restore at `pos` moves them past the block."""
        self.ahead.hold(seq, pos, tokens, opening=opening)

    def _move_up(self, seq: int, p0: int, delta: int) -> None:
        """`seq`'s cells from p0 on move up by `delta` (a held opening making room for a restored block)."""
        self._seq_add(seq, p0, -1, delta)
        self._shifted.add(self.rt.context_of(seq))

    def _shift_is_cheap(self, context: int, delta: int) -> bool:
        """Whether moving a few cells costs only their own rotation: the native K-shift applies (a host cache,
        calibrated), or a direct restore by `delta` leaves a device K-shift pending anyway."""
        direct = self._direct_for(context)
        if direct is None:
            return False
        return (self.geometry is not None and direct.on_host) or (bool(delta) and not direct.on_host)

    def claim_ahead(self, seq: int, pos: int, tokens: list[int], *, whole: bool = False) -> int:
        """`HeldAhead.claim`: how many leading `tokens` are already decoded at pos.. of `seq`."""
        return self.ahead.claim(seq, pos, tokens, whole=whole)

    # -- primitives -------------------------------------------------------------------------
    def save(self, seq: int, p0: int, p1: int) -> SavedKV:
        """Copy the K/V of [p0, p1) of `seq` to host bytes; the context is left unchanged."""
        self.rt._check_thread()
        if p1 <= p0:
            raise ValueError(f"empty range [{p0}, {p1})")
        context = self.rt.context_of(seq)
        self._flush_context(context)
        self.join_copies()
        direct = self._direct_for(context)
        if direct is not None:
            try:
                data = self._save_direct(direct, seq, p0, p1)
            except DirectError as exc:               # not each position once: llama.cpp writes what it holds
                if not self.rt.has_scratch(context):
                    raise RestoreError(f"[{p0}, {p1}) of seq {seq} cannot be saved: {exc}") from exc
                log.debug("serialised save: %s", exc)
            else:
                self.direct_saves += 1
                return SavedKV(data=data, origin_pos=p0, n_tokens=p1 - p0)
        self._need_scratch(context, "saved")
        self._seq_cp(seq, self.scratch, p0, p1, context)
        try:
            data = self._state_of(self.scratch, context)
        finally:
            self._seq_rm(self.scratch, -1, -1, context)
        return SavedKV(data=data, origin_pos=p0, n_tokens=p1 - p0)

    def save_deferred(self, seq: int, p0: int, p1: int) -> SavedKV:
        """`save`, with the rows copied on a worker thread while the engine goes on (a turn's eviction: the next
        decode overlaps the copy). The cells may be evicted at once; every decode, restore and save joins the copy
        first, and the pool waits (`SavedKV.wait`) before it reads the bytes. Where the direct path is not
        available this is `save`."""
        self.rt._check_thread()
        context = self.rt.context_of(seq)
        direct = self._direct_for(context) if p1 > p0 else None
        if direct is None:
            return self.save(seq, p0, p1)
        self._flush_context(context)
        try:
            out = self._save_buffer(direct.save_size(seq, p0, p1))
            plan = direct.plan_save(out, seq, p0, p1, self.scratch)
        except DirectError as exc:
            log.debug("deferred save taken at once: %s", exc)
            return self.save(seq, p0, p1)
        if self._copier is None:
            self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-copy")
        future = self._copier.submit(_copy_rows, plan, out)
        self._copying.append(future)
        self.direct_saves += 1
        self.deferred_saves += 1
        return SavedKV(data=out, origin_pos=p0, n_tokens=p1 - p0, pending=future)

    def join_copies(self) -> None:
        """Wait for every deferred save's row copy (before anything writes cells)."""
        copying, self._copying = self._copying, []
        for future in copying:
            future.result()

    def _join_then_decode(self, seq: int) -> None:
        self.join_copies()
        for context in sorted(self._shifted):        # rotated here, not by llama.cpp's graph over every cell
            self._shift_natively(context)
        if self._before_decode is not None:
            self._before_decode(seq)

    def _shift_natively(self, context: int) -> bool:
        """Apply `context`'s pending K-shift on the host (only the moved cells' K rows, no decode): True when done,
        False where only llama.cpp's own K-shift applies (a device cache, the native rotation not calibrated)."""
        if self.geometry is None:                   # not calibrated against llama.cpp's own K-shift (yet)
            return False
        direct = self._direct_for(context)
        if direct is None or not direct.on_host:
            return False
        self.join_copies()                          # a deferred save may still read the rows rotated here
        try:
            direct.apply_shift(self.geometry)
        except DirectError as exc:
            log.debug("K-shift left to llama.cpp: %s", exc)
            return False
        self._shifted.discard(context)
        self.shift_flushes += 1
        self.native_shifts += 1
        return True

    def _state_of(self, seq: int, context: int | None = None) -> bytearray:
        ctx = self.rt.ctx(self._context(seq, context))
        size = ll.llama_state_seq_get_size(ctx, seq)
        data = bytearray(size)
        written = ll.llama_state_seq_get_data(ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq)
        if written != size:
            del data[written:]
        return data

    def evict(self, seq: int, p0: int, p1: int, *, compact: bool = True) -> None:
        """Remove [p0, p1) from `seq`; with `compact`, later tokens move down to close the gap
        (tokens held ahead move with them and stay held)."""
        self.rt._check_thread()
        self.ahead.evicted(seq, p0, p1, compact=compact)
        if not self._seq_rm(seq, p0, p1):
            raise RuntimeError(f"llama_memory_seq_rm refused [{p0}, {p1}) of seq {seq}")
        if compact and self.pos_max(seq) >= p1:
            self._seq_add(seq, p1, -1, -(p1 - p0))
            self._shifted.add(self.rt.context_of(seq))

    def evict_ranges(self, seq: int, ranges: list[tuple[int, int]]) -> None:
        """`evict` of several disjoint ranges with compaction, as one: every later cell moves once, down by all
        that left before it (evicting them one by one moves the cells after the first range once per range).
        Positions and the K-shift each cell owes are the same either way."""
        self.rt._check_thread()
        ranges = sorted(ranges)
        for p0, p1 in reversed(ranges):
            self.ahead.evicted(seq, p0, p1, compact=True)
            if not self._seq_rm(seq, p0, p1):
                raise RuntimeError(f"llama_memory_seq_rm refused [{p0}, {p1}) of seq {seq}")
        last = self.pos_max(seq)
        removed = 0
        for i, (p0, p1) in enumerate(ranges):
            removed += p1 - p0
            upto = ranges[i + 1][0] if i + 1 < len(ranges) else last + 1
            if p1 < upto and p1 <= last:
                self._seq_add(seq, p1, upto, -removed)
                self._shifted.add(self.rt.context_of(seq))

    def restore(self, saved: SavedKV, seq: int, at_pos: int, *, before_opening: bool = False) -> None:
        """Splice saved K/V into `seq` at positions at_pos.. (RoPE re-anchored, no forward pass). Tokens held
        ahead are dropped, unless the block goes `before_opening` (an older block brought back ahead of the message
        the held opening opens): then a held opening at at_pos moves up past it where that is cheap."""
        self.rt._check_thread()
        self.join_copies()
        saved.wait()
        context = self.rt.context_of(seq)
        if before_opening and self._shift_is_cheap(context, at_pos - saved.origin_pos):
            self.ahead.make_room(seq, at_pos, saved.n_tokens)  # the opening moves past the block, not decoded again
        else:
            self.ahead.forget(seq)
        try:
            self._restore_at(saved, seq, context, at_pos)
        except BaseException:
            self.ahead.forget(seq)                  # a moved opening would sit past a gap
            raise

    def _restore_at(self, saved: SavedKV, seq: int, context: int, at_pos: int) -> None:
        delta, data = at_pos - saved.origin_pos, saved.data
        if self._restore_direct(saved, seq, context, delta):
            return
        self._need_scratch(context, f"restored into seq {seq}")
        if delta and self.geometry is not None:
            layout = reanchor.parse(data, self.geometry)
            if layout is not None:
                if isinstance(data, memoryview):     # mapped from a file: rotate a private copy, not its pages
                    data = self._rotation_copy(data)
                else:
                    saved.origin_pos = at_pos        # rotated in place below
                reanchor.shift(data, layout, self.geometry, delta)
                delta = 0
                self.native_reanchors += 1
        size = len(data)
        read = ll.llama_state_seq_set_data(self.rt.ctx(context), (ctypes.c_uint8 * size).from_buffer(data),
                                           size, self.scratch)
        if read == 0:
            self._seq_rm(self.scratch, -1, -1, context)
            raise RestoreError(f"llama.cpp rejected {saved.n_tokens} saved tokens "
                               "(no contiguous free cells, or bytes from another model)")
        if self.mirror is not None:
            self.mirror.load_state(self.scratch, data)
        try:
            if delta:
                self._seq_add(self.scratch, -1, -1, delta, context)
                self._shifted.add(context)
            self._seq_cp(self.scratch, seq, -1, -1, context)
        finally:
            self._seq_rm(self.scratch, -1, -1, context)

    def _need_scratch(self, context: int, what: str) -> None:
        """The serialised path's scratch sequence, or a RestoreError where the context has none (the streams' one:
        only the direct path moves its blocks, and it refused this one)."""
        if not self.rt.has_scratch(context):
            why = self.direct_note or "the direct path refused the bytes"
            raise RestoreError(f"a block cannot be {what} in a KV stream by llama.cpp's serialised state ({why}); "
                               "slot_layout = contexts moves every block")

    def _save_direct(self, direct: DirectKV, seq: int, p0: int, p1: int) -> bytearray | memoryview:
        """[p0, p1) of `seq` by the direct path, into the host arena (pinned on a GPU, pre-faulted on the CPU) while
        it has room, else into a buffer of its own."""
        out = self._save_buffer(direct.save_size(seq, p0, p1))
        direct.save_into(out, seq, p0, p1, self.scratch)
        return out

    def _save_buffer(self, size: int) -> bytearray | memoryview:
        """`size` bytes for a save: from the host arena while it has room, else a buffer of their own."""
        out = self.arena.buffer(size) if self.arena is not None else None
        return bytearray(size) if out is None else out

    def _restore_direct(self, saved: SavedKV, seq: int, context: int, delta: int) -> bool:
        """The restore by the direct path: True when it placed the cells; False to take the serialised path (no
        direct path here, bytes it does not read, or positions `seq` holds already: llama.cpp's own path gives the
        sequence a second cell there, as before); RestoreError when the cells have no room."""
        direct = self._direct_for(context)
        if direct is None:
            return False
        rotate = self.geometry if delta and direct.on_host else None
        try:
            direct.restore(saved.data, seq, delta, rotate)
        except DirectError as exc:
            if exc.status == kv_direct.NO_ROOM:
                raise RestoreError(f"{saved.n_tokens} saved tokens do not fit seq {seq}: {exc}") from exc
            # positions the sequence holds (llama.cpp's seq_cp lets two cells share one), bytes of another shape
            log.debug("serialised restore: %s", exc)
            return False
        self.direct_restores += 1
        if rotate is not None:
            self.native_reanchors += 1
        elif delta:
            self._shifted.add(context)
        if self.mirror is not None:               # as the serialised path tells it: loaded, moved, copied
            self.mirror.load_state(self.scratch, saved.data)
            if delta:
                self.mirror.seq_add(self.scratch, -1, -1, delta)
            self.mirror.seq_cp(self.scratch, seq, -1, -1)
            self.mirror.seq_rm(self.scratch, -1, -1)
        return True

    def _direct_for(self, context: int) -> DirectKV | None:
        """The direct path over `context`'s cache, opened on first use; None where it is off or not covered."""
        if not self.use_direct or self.direct_note:
            return None
        ctx = self.rt.ctx(context)
        key = ctypes.cast(ctx, ctypes.c_void_p).value or 0
        direct = self._direct.get(key)
        if direct is None:
            direct, why = DirectKV.open(ctx)
            if direct is None:
                self.direct_note = why
                log.info("KV blocks move through llama.cpp's serialised state: %s", why)
                return None
            self._direct[key] = direct
        return direct

    def _calibrate_direct(self) -> str:
        """Use the direct path only where it writes what llama.cpp's serialisation writes, and reads it back to the
        same state (at the same positions, and re-anchored as the native rotation re-anchors). "" when it holds."""
        if not kv_direct.available():
            return f"the direct KV library is {kv_direct.missing_note()}"
        if not self.rt.eviction_supported:
            return self.rt.eviction_note
        if self.rt.settings.rpc_servers:          # layers on remote devices: not checked there, so not used there
            return "the model is split over RPC workers"
        direct = self._direct_for(self.rt.context_of(self.scratch))
        if direct is None:
            return self.direct_note or "the direct path is off"
        rt, scratch, delta = self.rt, self.scratch, 37
        probe = rt.tokenize("Calibration: the quick brown fox jumps over the lazy dog.")[:12]
        try:
            rt.decode(probe, scratch, 0, logits_last=False)
            theirs = self._state_of(scratch)
            ours = direct.save(scratch, 0, len(probe), scratch)
            if bytes(ours) != bytes(theirs):
                return "the direct save differs from llama.cpp's serialisation"
            self._seq_rm(scratch, -1, -1)
            direct.restore(ours, scratch, 0)
            if bytes(self._state_of(scratch)) != bytes(theirs):
                return "the direct restore does not read back as llama.cpp's state"
            if self.geometry is not None and direct.on_host:
                self._seq_rm(scratch, -1, -1)
                direct.restore(ours, scratch, delta, self.geometry)
                expected = bytearray(theirs)
                reanchor.shift(expected, reanchor.parse(expected, self.geometry), self.geometry, delta)
                if bytes(self._state_of(scratch)) != bytes(expected):
                    return "the fused re-anchor differs from the native rotation"
        except DirectError as exc:
            return f"the direct path refused its calibration ({exc})"
        finally:
            self._seq_rm(scratch, -1, -1)
        return ""

    def _rotation_copy(self, data: memoryview) -> memoryview:
        """`data` copied into the reused rotation buffer. Rotating a copy-on-write file mapping in place
        faults in a private copy of every page (3-9 ms for a 120-token block against ~1.5 ms copied
        here, AMD EPYC, 2026-11-24); the mapped bytes stay as the file has them. Blocks are small; a
        larger image (a whole slot moved) gets a buffer of its own rather than one kept for good."""
        if len(data) > _ROTATION_BUFFER_MAX:
            return memoryview(bytearray(data))
        if len(self._rotation_buffer) < len(data):
            self._rotation_buffer = bytearray(len(data))
        view = memoryview(self._rotation_buffer)[:len(data)]
        view[:] = data
        return view

    def share(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Give `dst` the cells of `src` in [p0, p1): no decode and no byte copy within one context's stream; a
        copy of the bytes (save, restore at the same positions, replacing what `dst` held there) between two."""
        self.rt._check_thread()
        self.ahead.shared(src, dst, p1)
        if self.same_cells(src, dst):
            self._seq_cp(src, dst, p0, p1)
            return
        first = self.pos_min(src) if p0 < 0 else p0
        end = self.pos_max(src) + 1 if p1 < 0 else p1
        if end > first >= 0:
            saved = self.save(src, first, end)
            self._seq_rm(dst, first, end)           # what `dst` held there is replaced, never held twice
            self.restore(saved, dst, first)

    def hold_cells(self, seq: int) -> bytes:
        """All of `seq`'s cells as llama.cpp's sequence state, to be put back by `put_back_cells` (a gloss cut short
        by a turn, kept in RAM while the scratch serves other work)."""
        self.rt._check_thread()
        self.join_copies()
        return bytes(self._state_of(seq))

    def put_back_cells(self, seq: int, data: bytes) -> bool:
        """`seq` emptied and filled again from `hold_cells`' bytes, at the positions they had; False (`seq` left
        empty) when llama.cpp rejects them (no contiguous free cells, another model's bytes)."""
        self.rt._check_thread()
        self.join_copies()
        self._seq_rm(seq, -1, -1)
        buffer = bytearray(data)
        size = len(buffer)
        if not size or not ll.llama_state_seq_set_data(self.rt.ctx(self.rt.context_of(seq)),
                                                       (ctypes.c_uint8 * size).from_buffer(buffer), size, seq):
            self._seq_rm(seq, -1, -1)
            return False
        if self.mirror is not None:
            self.mirror.load_state(seq, buffer)
        return True

    def drop(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Forget [p0, p1) of `seq` without compaction (cells shared elsewhere survive)."""
        self.rt._check_thread()
        self.ahead.forget(seq)
        self._seq_rm(seq, p0, p1)

    def flush_pending_shifts(self, via_seq: int | None = None) -> None:
        """Apply every queued K-shift now: in each context with one, a token decoded in an empty
        sequence (the scratch, or `via_seq`), then removed."""
        for context in sorted(self._shifted):
            self._flush_context(context, via_seq)

    def _flush_context(self, context: int, via_seq: int | None = None) -> None:
        if context not in self._shifted or self._shift_natively(context):
            return
        if via_seq is None and not self.rt.has_scratch(context):
            # no scratch in the streams' context: one token past the end of a slot's sequence, then gone (llama.cpp
            # shifts every stream before any decode)
            self.join_copies()
            at = self.pos_max(0) + 1
            self.rt.decode([self._flush_token()], 0, at, logits_last=False, context=context)
            self._seq_rm(0, at, -1, context)
        else:
            seq = self.scratch if via_seq is None else via_seq
            self.rt.decode([self._flush_token()], seq, 0, logits_last=False, context=context)
            self._seq_rm(seq, -1, -1, context)
        self._shifted.discard(context)
        self.shift_flushes += 1

    # -- llama.cpp's sequence operations, followed by the mirror ----------------------------------
    def _context(self, seq: int, context: int | None) -> int:
        """`context` when given (the scratch serving another context), else the one `seq` lives in."""
        return self.rt.context_of(seq) if context is None else context

    def _memory(self, seq: int, context: int | None = None):
        return self.rt.memory(self._context(seq, context))

    def _seq_rm(self, seq: int, p0: int, p1: int, context: int | None = None) -> bool:
        ok = ll.llama_memory_seq_rm(self._memory(seq, context), seq, p0, p1)
        if ok and self.mirror is not None:
            self.mirror.seq_rm(seq, p0, p1)
        return ok

    def _seq_add(self, seq: int, p0: int, p1: int, delta: int, context: int | None = None) -> None:
        ll.llama_memory_seq_add(self._memory(seq, context), seq, p0, p1, delta)
        if self.mirror is not None:
            self.mirror.seq_add(seq, p0, p1, delta)

    def _seq_cp(self, src: int, dst: int, p0: int, p1: int, context: int | None = None) -> None:
        ll.llama_memory_seq_cp(self._memory(dst, context), src, dst, p0, p1)
        if self.mirror is not None:
            self.mirror.seq_cp(src, dst, p0, p1)

    def _flush_token(self) -> int:
        bos = ll.llama_vocab_bos(self.rt.vocab)
        return bos if bos >= 0 else 0

    # -- native re-anchoring ------------------------------------------------------------------
    def _rope_geometry(self) -> reanchor.RopeGeometry | None:
        return rope_geometry(self.rt)

    def _calibrate_native_reanchor(self) -> str:
        """Use the native rotation only if it reproduces llama.cpp's own K-shift on this model."""
        if not reanchor.available():
            return "native library not built: llama.cpp K-shift used"
        if not self.rt.eviction_supported:
            return self.rt.eviction_note
        geometry = self._rope_geometry()
        if geometry is None:
            return "rope scaling not covered by the native rotation: llama.cpp K-shift used"
        rt, delta = self.rt, 37
        probe = rt.tokenize("Calibration: the quick brown fox jumps over the lazy dog.")[:12]
        try:
            rt.decode(probe, self.scratch, 0, logits_last=False)
            original = self._state_of(self.scratch)
            layout = reanchor.parse(original, geometry)
            if layout is None:
                return "state layout not recognised: llama.cpp K-shift used"
            ours = bytearray(original)
            reanchor.shift(ours, layout, geometry, delta)
            self._seq_add(self.scratch, -1, -1, delta)
            self._shifted.add(self.rt.context_of(self.scratch))
            self.flush_pending_shifts(via_seq=0)
            theirs = self._state_of(self.scratch)
        finally:
            self._seq_rm(self.scratch, -1, -1)
        if len(theirs) != len(ours) or reanchor.parse(theirs, geometry) != layout:
            return "llama.cpp's shifted state differs in shape: llama.cpp K-shift used"
        a = np.frombuffer(bytes(ours), dtype=np.uint8)
        b = np.frombuffer(bytes(theirs), dtype=np.uint8)
        row_bytes = geometry.n_head_kv * geometry.head_dim * 2
        worst = 0.0
        for k_offset in layout.k_offsets:
            span = slice(k_offset, k_offset + layout.n_cells * row_bytes)
            ka, kb = a[span].view(np.float16).astype(np.float32), b[span].view(np.float16).astype(np.float32)
            worst = max(worst, float(np.abs(ka - kb).max() / (np.abs(kb).max() + 1e-6)))
        head = slice(0, layout.k_offsets[0])
        if a[head].tobytes() != b[head].tobytes() or worst > 1e-2:
            return f"native rotation differs from llama.cpp's (rel {worst:.2e}): llama.cpp K-shift used"
        self.geometry = geometry
        self.calibration_error = worst
        return ""


def _copy_rows(plan: int, out: bytearray | memoryview) -> int:
    """A deferred save's copy; holding `out` keeps its buffer (an arena span) from being reused meanwhile, even
    when the SavedKV it went to is let go first."""
    written = DirectKV.copy_rows(plan)
    del out
    return written


def rope_geometry(rt: Runtime) -> reanchor.RopeGeometry | None:
    """The model's RoPE geometry when the native rotation covers it (NORM or NEOX, no or linear scaling)."""
    arch = rt.meta("general.architecture") or ""
    rope_type = ll.llama_model_rope_type(rt.model)
    if rope_type not in (0, 2) or rt.meta(f"{arch}.rope.scaling.type") not in (None, "none", "linear"):
        return None
    n_head = ll.llama_model_n_head(rt.model)
    n_head_kv = ll.llama_model_n_head_kv(rt.model)
    head_dim = int(rt.meta(f"{arch}.attention.key_length") or ll.llama_model_n_embd(rt.model) // n_head)
    n_rot = int(rt.meta(f"{arch}.rope.dimension_count") or head_dim)
    scale = float(ll.llama_model_rope_freq_scale_train(rt.model) or 1.0)
    return reanchor.RopeGeometry(
        n_layer=ll.llama_model_n_layer(rt.model), n_head_kv=n_head_kv, head_dim=head_dim, n_rot=n_rot,
        mode=rope_type, freq_base=float(rt.meta(f"{arch}.rope.freq_base") or 10000.0),
        freq_scale=scale)
