"""Tokens decoded at the end of a sequence ahead of the message that will own them: the rules `KVCache` and the
fake cache (`benchmarks/kv_sim.py`'s `FakeKVCache`) share, so a test of the fake tests the real bookkeeping.

Invariants: at most one held run per sequence, at the cells after every block; it lives only until the next
operation on its sequence: any but a compaction below it or a block spliced in at its start forgets it (its cells
removed through `remove`), and `claim` hands it to the decode that was going to decode those tokens anyway. Only
a run's `opening` (the template's role header, no user text) survives a splice: it moves up past the block
(`move`), since what it says does not depend on what comes before it; the user's words after it are dropped.
"""

from __future__ import annotations

from collections.abc import Callable


class HeldAhead:
    """seq -> (first position, tokens, opening) of what was decoded ahead; `remove(seq, p0)` drops a run's cells
    from p0 on, `move(seq, p0, delta)` moves them up (a K-shift they then owe)."""

    def __init__(self, remove: Callable[[int, int], object],
                 move: Callable[[int, int, int], object] | None = None) -> None:
        self._held: dict[int, tuple[int, list[int], int]] = {}
        self._remove = remove
        self._move = move
        self.claimed = 0                          # tokens held ahead that a decode then skipped
        self.moved = 0                            # openings moved past a spliced block instead of decoded again

    def tokens(self, seq: int) -> list[int]:
        held = self._held.get(seq)
        return list(held[1]) if held else []

    def opening(self, seq: int) -> int:
        """How many leading tokens of `seq`'s held run are the template's opening (no user text)."""
        held = self._held.get(seq)
        return held[2] if held else 0

    def hold(self, seq: int, pos: int, tokens: list[int], *, opening: int = 0) -> None:
        """`tokens` were decoded at pos.. of `seq`, before the message they open exists; the first `opening` of
        them are the template's role header."""
        self.forget(seq)
        if tokens:
            self._held[seq] = (pos, list(tokens), max(0, min(opening, len(tokens))))

    def claim(self, seq: int, pos: int, tokens: list[int], *, whole: bool = False) -> int:
        """How many leading `tokens` are already decoded at pos.. of `seq`: those cells now belong to the caller,
        who decodes only the rest. A held run that does not match is dropped (0). Unless `whole`, one token is
        always left to decode (its logits are wanted)."""
        held = self._held.pop(seq, None)
        if held is None:
            return 0
        at, ahead, _ = held
        if at == pos and tokens[:len(ahead)] == ahead and (whole or len(tokens) > len(ahead)):
            self.claimed += len(ahead)
            return len(ahead)
        self._remove(seq, at)
        return 0

    def forget(self, seq: int) -> None:
        held = self._held.pop(seq, None)
        if held is not None:
            self._remove(seq, held[0])

    def make_room(self, seq: int, at: int, n: int) -> bool:
        """`n` tokens are about to be spliced in at `at`: a run held from `at` keeps its opening, moved up by `n`
        past them, and drops the rest (words computed without the block would not have seen it); True when an
        opening was kept. Any other run is forgotten, and so is every run without a `move`."""
        held = self._held.get(seq)
        if held is None:
            return False
        pos, tokens, opening = held
        if pos != at or not opening or self._move is None:
            self.forget(seq)
            return False
        if opening < len(tokens):
            self._remove(seq, pos + opening)
        self._move(seq, pos, n)
        self._held[seq] = (pos + n, tokens[:opening], opening)
        self.moved += 1
        return True

    def evicted(self, seq: int, p0: int, p1: int, *, compact: bool) -> None:
        """[p0, p1) of `seq` is leaving: a compaction below the run moves it down with the later cells; any other
        eviction forgets it."""
        held = self._held.get(seq)
        if held is None:
            return
        if compact and p1 <= held[0]:
            self._held[seq] = (held[0] - (p1 - p0), held[1], held[2])
        else:
            self.forget(seq)

    def shared(self, src: int, dst: int, p1: int) -> None:
        """`src`'s cells up to `p1` (-1: all) are copied to `dst`: a range over `src`'s run forgets it (the copy
        would carry it), and `dst` loses its own."""
        held = self._held.get(src)
        if held is not None and (p1 < 0 or p1 > held[0]):
            self.forget(src)
        self.forget(dst)
