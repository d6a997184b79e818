"""llama.cpp's tokenizer called once, with the buffer it asks for: the one place the engine's model and the
vocabulary-only copy tokenize (so both give the same tokens for the same text and flags).

Invariants: no state; the caller holds whatever lock its vocabulary needs.
"""

from __future__ import annotations

import llama_cpp as ll


def tokenize_with(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """`text`'s tokens under `vocab` (a llama_vocab pointer), retried once with the size llama.cpp reports."""
    data = text.encode("utf-8")
    cap = len(data) + 16
    buf = (ll.llama_token * cap)()
    n = ll.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    if n < 0:
        cap = -n
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    return list(buf[:n])
