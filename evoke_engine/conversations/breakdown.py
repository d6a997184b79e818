"""Where one turn's time went (issue 44): the recovery decision, embedding, restores, the prompt's decode, sampling,
the reply tokens' decode, detokenising and the engine's own Python (the remainder), for the whole turn and up to the
first token, and the work after the reply (`turn_end`).

Invariants: phases are measured at the call sites in `turn.py` with `time.perf_counter` (a few calls per token, no
allocation in the loop); `python_s` is the turn's wall time less every measured phase, never negative; the phases
that are llama.cpp calls (`LLAMA_PHASES`, their thin Python wrappers included) against the rest give the engine's
time outside llama.cpp (`outside_llama_s`), which `bench overhead` reports. A phase holds what its calls did: the
prompt's decode includes the room it makes (evictions), a restore includes its splice, `turn_end` (after the reply:
closing the reply, the turn end's evictions and embedding the turn's blocks and lines) is in neither side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PHASES = ("decide", "embed", "restore", "prompt_decode", "sample", "token_decode", "detokenize", "turn_end")
LLAMA_PHASES = ("restore", "prompt_decode", "sample", "token_decode", "detokenize")


def _rounded(seconds: dict[str, float], total: float) -> dict[str, float]:
    measured = sum(seconds.values())
    out = {f"{phase}_s": round(seconds[phase], 6) for phase in PHASES}
    python = max(0.0, total - measured)
    out["python_s"] = round(python, 6)
    out["outside_llama_s"] = round(python + seconds["decide"] + seconds["embed"], 6)
    out["total_s"] = round(total, 6)
    return out


@dataclass
class TurnBreakdown:
    """Seconds per phase of one turn; `first_token` is the same as of the moment the first token was sampled."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    first_token: dict[str, float] | None = None
    total_s: float = 0.0

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    def mark_first_token(self, elapsed_s: float) -> None:
        """The first token is out, `elapsed_s` after the turn began: what the user waited for, by phase."""
        if self.first_token is None:
            self.first_token = _rounded(self.seconds, elapsed_s)

    def finish(self, elapsed_s: float) -> None:
        self.total_s = elapsed_s

    def as_dict(self) -> dict:
        """Plain data for a reply's metrics and the stats: `<phase>_s`, `python_s`, `outside_llama_s`, `total_s`,
        and `first_token` (the same keys up to the first token; absent when no token came)."""
        out: dict = _rounded(self.seconds, self.total_s)
        if self.first_token is not None:
            out["first_token"] = dict(self.first_token)
        return out

