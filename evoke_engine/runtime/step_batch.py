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

    def add(self, entry: StepToken) -> None:
        if len(self.waiting) >= self.capacity:
            raise RuntimeError("more replies wait for a step than the batch holds (n_batch)")
        self.waiting.append(entry)

    def run(self, ctx, n_ctx: int) -> None:
        """Decode every waiting token in one call, then have each reply's sampler sample its row. Where llama.cpp
        refuses the batch (no room for all), each token is tried alone so only the one without room fails."""
        waiting, self.waiting = sorted(self.waiting, key=lambda entry: entry.seq), []
        if not waiting:          # (in seq order: llama.cpp puts KV streams in one ubatch only as a run of seq ids)
            return
        rc = self._decode(ctx, waiting)
        if rc == 0:
            for row, entry in enumerate(waiting):
                self._presample(entry, row)
            return
        for entry in waiting:
            rc = self._decode(ctx, [entry])
            if rc != 0:
                entry.failure = DecodeError(rc, n_ctx)
            else:
                self._presample(entry, 0)

    def _decode(self, ctx, entries: list[StepToken]) -> int:
        batch = self._batch
        for i, entry in enumerate(entries):
            batch.token[i] = entry.token
            batch.pos[i] = entry.pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = entry.seq
            batch.logits[i] = 1
        batch.n_tokens = len(entries)
        rc = ll.llama_decode(ctx, batch)
        if rc == 0:
            self.steps += 1
            self.tokens += len(entries)
        return rc

    def _presample(self, entry: StepToken, row: int) -> None:
        sampler = self.samplers.get(entry.seq)
        if sampler is not None:
            sampler.presample(row)

    def close(self) -> None:
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
