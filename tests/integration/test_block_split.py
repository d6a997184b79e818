"""Blocks keep a line whole: `split_tokens` on the model's own tokenizer (vocabulary only) cuts indented code, YAML and
prose at line ends, where the tokenizer glues a newline to the next line's indentation."""

from __future__ import annotations

import pytest

from benchmarks.retrieval_sim import VocabRuntime
from evoke_engine.conversations.turn import split_tokens

KOTLIN = "\n".join(f"    const val SETTING_NUMBER_{i} = {i * 37}L   // what setting {i} is for" for i in range(40))
YAML = "\n".join(f"  service_{i}:\n    replicas: {i}\n    memory: \"{i * 64}Mi\"\n" for i in range(30))
PROSE = "\n".join(f"Line {i} of the notes says the job number {i} runs at {i % 24}:00 every day." for i in range(40))


@pytest.fixture(scope="module")
def rt():
    return VocabRuntime(None)


@pytest.mark.parametrize("text", [KOTLIN, YAML, PROSE], ids=["kotlin", "yaml", "prose"])
def test_every_line_stays_in_one_block_and_blocks_keep_their_size_range(rt, text):
    tokens = rt.tokenize(text, parse_special=False)
    chunks = split_tokens(rt, tokens, 128)
    assert len(chunks) >= 3 and sum(chunks, []) == tokens
    assert all(int(128 * 0.6) < len(chunk) <= 128 for chunk in chunks[:-1])
    texts = [rt.detokenize(chunk) for chunk in chunks]
    spans, at = [], 0
    for piece in texts:
        spans.append((at, at + len(piece)))
        at += len(piece)
    whole = "".join(texts)
    cursor = 0
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        start = whole.index(line, cursor)
        end = cursor = start + len(line)
        assert sum(1 for a, b in spans if a < end and b > start) == 1, line
