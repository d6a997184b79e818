"""How long this model's decodes take here, as they run: a reply's token step (one token of each decoding reply, in
one decode) and a prompt token in a prefill chunk; the scheduler sizes prefill steps beside decoding replies from them.

Invariants: moving averages of measured decodes only (no guess until the first one); a chunk's time is what its
`llama_decode` took, a token step's what the decode and its replies' sampling took (the shared step samples each row
at once), not the Python of the replies around it.
"""

from __future__ import annotations

from dataclasses import dataclass

NEWEST_WEIGHT = 0.25           # the weight of the newest measure in each average


@dataclass
class DecodePace:
    token_step_s: float | None = None          # a decode of the decoding replies' next tokens
    prompt_token_s: float | None = None        # a prompt token in a prefill chunk (chunks of two tokens or more)

    def token_step(self, seconds: float) -> None:
        self.token_step_s = _average(self.token_step_s, seconds)

    def prompt_chunk(self, tokens: int, seconds: float) -> None:
        if tokens >= 2:
            self.prompt_token_s = _average(self.prompt_token_s, seconds / tokens)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - NEWEST_WEIGHT) * old + NEWEST_WEIGHT * new
