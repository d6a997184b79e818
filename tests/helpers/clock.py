"""A settable clock for tests: call it for the time, move `now` (or `advance`) to let time pass.

Owns nothing else; every test that drives TTLs, sweeps or rate limits by hand uses this one.
"""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
