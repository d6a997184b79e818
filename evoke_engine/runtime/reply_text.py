"""Sampled tokens as text: `ReplyText` joins UTF-8 split across tokens and ends the text before the first stop string.

Invariants: `text` is exactly what was handed out (`add`'s pieces, then `finish`'s); no part of a stop string is ever
in it: text that could be the start of one is held back until the next token decides (llama-server's partial-stop
rule), so a stop split across tokens is still found and cut whole; nothing is handed out after a stop.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class ReplyText:
    def __init__(self, token_bytes, stops: Sequence[str] = ()) -> None:
        """`token_bytes(token)`: a token's raw bytes (`Runtime.token_bytes`)."""
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self._held = ""           # the end of the text so far that a stop string may begin with

    def add(self, token: int) -> tuple[str, bool]:
        """The text to hand out now (maybe "": an incomplete character, or the start of a stop string) and whether
        a stop string ended the reply."""
        candidate = self._held + self._decoder.decode(self._token_bytes(token))
        hits = [i for s in self.stops if (i := candidate.find(s)) >= 0]
        if hits:
            out, self._held = candidate[:min(hits)], ""
            self.text += out
            return out, True
        keep = partial_stop(candidate, self.stops)
        out, self._held = candidate[:len(candidate) - keep], candidate[len(candidate) - keep:]
        self.text += out
        return out, False

    def finish(self) -> str:
        """What is left to hand out when the reply ends without a stop: text held back and an incomplete last
        character (as U+FFFD)."""
        out, self._held = self._held + self._decoder.decode(b"", final=True), ""
        self.text += out
        return out


def partial_stop(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of `text` that is the start (not the whole) of a stop string."""
    return max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])),
               default=0)
