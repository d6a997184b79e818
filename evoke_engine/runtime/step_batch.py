"""One decode step shared by every streaming reply of a context: each reply's next token goes into one `llama_batch`,
one `llama_decode` computes them all, and each reply's own sampler chain samples its own logits row at once.

Invariants: a token waits here only while its reply is parked (the engine runs the step on the scheduler's thread);
between the step's decode and the last participant's sample nothing else decodes, so no reply reads logits another
decode overwrote; a participant whose token did not fit gets its own `DecodeError`, the others their tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp as ll

from ..errors import DecodeError
from . import compute_thread


@dataclass
class StepToken:
    """One reply's next token, waiting for the shared step: where it goes and what became of it."""
    seq: int
    token: int
    pos: int
    failure: DecodeError | None = None


class StepBatch:
    """The tokens waiting for the next shared decode of one context, and the samplers that read its rows."""

    def __init__(self, capacity: int, n_seq_max: int) -> None:
        self.capacity = capacity
        self.waiting: list[StepToken] = []
        self.samplers: dict[int, object] = {}          # seq -> the SamplerChain of the reply decoding there
        self._batch = ll.llama_batch_init(capacity, 0, n_seq_max)
        self.steps = 0                                  # shared decodes run (diagnostics, tests)
        self.tokens = 0                                 # tokens they decoded
        self.filled = 0                                 # filler tokens that joined runs of KV streams
        # fill a gap between waiting KV streams with a filler token (one ubatch) rather than let llama.cpp decode
        # each run of consecutive seq ids as a ubatch of its own: where a token in a ubatch is nearly free and each
        # ubatch passes over every weight (a GPU, a large model). Off on the embedded model on two CPU cores, where
        # a token costs 6.5-8 ms more in a ubatch and a ubatch 3-4 ms (measured: 1-4 streams 10.8/17.2/23.5/31.8 ms;
        # four waiting streams around a gap 41.7 ms with a filler, about 35 ms as two ubatches)
        self.fill_gaps = False
        self.last_rc = 0

    def add(self, entry: StepToken) -> None:
        if len(self.waiting) >= self.capacity:
            raise RuntimeError("more replies wait for a step than the batch holds (n_batch)")
        self.waiting.append(entry)

    def run(self, ctx, n_ctx: int, *, streams_memory=None) -> None:
        """Decode every waiting token in one call, then have each reply's sampler sample its row. Where llama.cpp
        refuses the batch (no room for all), each token is tried alone so only the one without room fails.

        `streams_memory` (a cache with a KV stream per sequence): llama.cpp puts streams in one ubatch only as a run
        of consecutive seq ids; with `fill_gaps`, a sequence between two waiting ones that has no token here gets a
        filler token past its end, removed again right after the decode (one pass over the weights, not one per
        run)."""
        waiting, self.waiting = sorted(self.waiting, key=lambda entry: entry.seq), []
        if not waiting:
            return
        fillers = _fillers(waiting, streams_memory) if streams_memory is not None and self.fill_gaps else []
        try:
            rows = self._decode(ctx, waiting, fillers)
        finally:
            for filler in fillers:
                ll.llama_memory_seq_rm(streams_memory, filler.seq, filler.pos, -1)
        if rows is not None:
            for entry, row in zip(waiting, rows, strict=True):
                self._presample(entry, row)
            return
        for entry in waiting:
            if self._decode(ctx, [entry]) is None:
                entry.failure = DecodeError(self.last_rc, n_ctx)
            else:
                self._presample(entry, 0)

    def _decode(self, ctx, entries: list[StepToken], fillers: list[StepToken] = ()) -> list[int] | None:
        """One decode of `entries` (and `fillers`, without logits) in seq order: each entry's batch row, or None
        when llama.cpp refused it (`last_rc`)."""
        batch = self._batch
        ordered = sorted([*((e, True) for e in entries), *((f, False) for f in fillers)], key=lambda x: x[0].seq)
        rows: dict[int, int] = {}
        for i, (entry, wanted) in enumerate(ordered):
            batch.token[i] = entry.token
            batch.pos[i] = entry.pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = entry.seq
            batch.logits[i] = int(wanted)
            if wanted:
                rows[id(entry)] = i
        batch.n_tokens = len(ordered)
        self.last_rc = compute_thread.llama_decode(ctx, batch)
        if self.last_rc != 0:
            return None
        self.steps += 1
        self.tokens += len(entries)
        self.filled += len(fillers)
        return [rows[id(entry)] for entry in entries]

    def _presample(self, entry: StepToken, row: int) -> None:
        sampler = self.samplers.get(entry.seq)
        if sampler is not None:
            sampler.presample(row)

    def close(self) -> None:
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None


def _fillers(waiting: list[StepToken], memory) -> list[StepToken]:
    """A token past the end of each sequence between the first and the last waiting one that has none waiting."""
    have = {entry.seq for entry in waiting}
    token = waiting[0].token
    return [StepToken(seq, token, ll.llama_memory_seq_pos_max(memory, seq) + 1)
            for seq in range(waiting[0].seq, waiting[-1].seq) if seq not in have]
