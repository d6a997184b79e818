"""Sampled tokens as text: `ReplyText` joins UTF-8 split across tokens and ends the text before the first stop string;
`tokens_before_stop` says which of a reply's decoded tokens its text still covers once a stop cut it.

Invariants: `text` is exactly what was handed out (`add`'s pieces, then `finish`'s); nothing is handed out after a
stop, and a stop split across tokens is still found. With `hold_back` (the default: a completion and a chat turn), no
part of a stop string is ever in `text`: text that could be the start of one waits until the next token decides
(llama-server's partial-stop rule). A chat turn then takes the stop's start back out of its KV too
(`tokens_before_stop`), so the stored reply, its text and its cells all end before the stop. Without `hold_back`,
every decoded token's text is handed out and the start of a stop string that spans tokens stays in it.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class ReplyText:
    def __init__(self, token_bytes, stops: Sequence[str] = (), *, hold_back: bool = True) -> None:
        """`token_bytes(token)`: a token's raw bytes (`Runtime.token_bytes`)."""
        self._token_bytes = token_bytes
        self._hold_back = hold_back
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self._held = ""           # the end of the text so far that a stop string may begin with

    def add(self, token: int) -> tuple[str, bool]:
        """The text to hand out now (maybe "": an incomplete character, or the start of a stop string) and whether
        a stop string ended the reply."""
        candidate = self._held + self._decoder.decode(self._token_bytes(token))
        longest = max((len(s) for s in self.stops), default=0)
        searched = self.text[len(self.text) - longest:] if longest and not self._hold_back else ""   # a stop's start
        hits = [i - len(searched) for s in self.stops if (i := (searched + candidate).find(s)) >= 0]
        if hits:
            out, self._held = candidate[:max(0, min(hits))], ""
            self.text += out
            return out, True
        keep = partial_stop(candidate, self.stops) if self._hold_back else 0
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


def tokens_before_stop(token_bytes, decoded: Sequence[int], text: str) -> tuple[int, str]:
    """(kept, rest) for a reply whose `text` a stop string cut: the first `kept` of its `decoded` tokens hold only text
    of `text` (their decoded text is a prefix of it), and `rest` is the end of `text` they do not cover (the part
    of a token that also began the stop), to be tokenized and decoded in place of the tokens taken back.
    `token_bytes(token)`: a token's raw bytes. Looks back from the end: a stop takes back a few tokens."""
    joined = b"".join(token_bytes(t) for t in decoded)
    ends = [len(joined)]
    for token in reversed(decoded):
        ends.append(ends[-1] - len(token_bytes(token)))
    ends.reverse()                       # ends[k]: the byte length of decoded[:k]
    for kept in range(len(decoded), -1, -1):
        covered = joined[:ends[kept]].decode("utf-8", "replace")
        if text.startswith(covered):
            return kept, text[len(covered):]
    return 0, text
