"""The code-aware lexical signal (`memory/lexical.py`) and its fusion with line vectors (`recall_signal=fused`):
tokenizer, best-line BM25, ranks with ties, and what a recovery decision records. Plain text, no model."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory.lexical import bm25_lines, ranks, stem, terms
from evoke_engine.memory.recall_signals import RecallSignal, block_lines, code_words, lexical_lines

pytestmark = pytest.mark.unit


def test_identifiers_split_on_underscores_camel_case_and_dots_and_stay_whole_too():
    assert terms("MAX_UPLOAD_CHUNK_BYTES = 4096") == ["max", "upload", "chunk", "byte", "maxuploadchunkbytes", "4096"]
    assert terms('"maxConcurrentJobs": 5') == ["max", "concurrent", "job", "maxconcurrentjobs", "5"]
    assert terms("HTTPServer") == ["http", "server", "httpserver"]
    assert terms("lib/db.py config.yaml") == ["lib", "db", "py", "config", "yaml"]


def test_numbers_are_tokens_and_function_words_and_single_letters_are_dropped():
    assert terms("What is the port? It is 5432, a b 7") == ["port", "5432", "7"]
    assert terms("2026-11-25") == ["2026", "11", "25"]


def test_a_light_plural_stemmer():
    assert [stem(w) for w in ("retries", "classes", "jobs", "status", "keys", "boxes", "bus")] == \
        ["retry", "class", "job", "status", "key", "box", "bus"]
    assert terms("retry") == terms("retries")


def test_bm25_scores_a_block_by_its_best_line_and_leaves_out_blocks_without_a_hit():
    lines = {"a": ["import logging", "RETRY_CEILING = 7"], "b": ["the retries are logged"], "c": ["nothing here"]}
    scores = bm25_lines(lines, "How many retries before the ceiling?")
    assert set(scores) == {"a", "b"} and scores["a"] > scores["b"]     # two terms on one line beat one
    assert bm25_lines(lines, "the of and") == {}                        # only function words: no terms


def test_bm25_prefers_rare_terms():
    lines = {"common": ["service service config"], "rare": ["service webhook"],
             **{f"f{i}": [f"service line {i}"] for i in range(6)}}
    scores = bm25_lines(lines, "webhook service")
    assert max(scores, key=scores.get) == "rare"


def test_ranks_put_keys_without_a_value_after_the_last_one():
    assert ranks({"x": 3.0, "y": 5.0}, ["x", "y", "z", "w"]) == {"y": 1, "x": 2, "z": 3, "w": 3}


def test_code_words_split_identifiers_for_the_embedder_and_leave_prose_alone():
    assert code_words("export const RETRY_CEILING = 7;") == "export const RETRY CEILING = 7;"
    assert code_words("timeoutMs: 30") == "timeout Ms: 30"
    assert code_words("The cache keeps entries for 30 minutes.") == "The cache keeps entries for 30 minutes."


def test_block_lines_leave_out_the_file_framing():
    text = "[file lib/db.py]\ndef connect(host, timeout_ms=250):\n    pass\n[end of file lib/db.py]\n"
    assert not any(line.startswith(("[file", "[end of file")) for line in block_lines(text))


class ConstantEmbedder:
    """Every text embeds to one vector: dense ranks are ties, so the lexical list decides the fusion."""

    enabled = True
    identity = "constant"

    def embed(self, texts):
        return np.ones((len(texts), 4), dtype=np.float32) / 2 if texts else None

    def embed_one(self, text):
        return np.ones(4, dtype=np.float32) / 2


def _block(name: str, text: str, cosine: float, embedder, file_name: str | None = None) -> Block:
    block = Block(name=name, role="file", turn=1, tokens=[zlib.crc32(text.encode()) % 1000, len(text)], text=text,
                  state=BlockState.RAM, file_name=file_name)
    block.embedding = np.array([cosine, np.sqrt(1 - cosine ** 2), 0, 0], dtype=np.float32)
    return block


@pytest.mark.parametrize("mode", ["lexical", "fused"])
def test_a_block_naming_the_asked_identifier_ranks_first_and_the_decision_says_why(mode):
    embedder = ConstantEmbedder()
    query = "What does backoffDelayMs default to?"
    blocks = [_block("file:api.ts#0", "import { z } from 'zod';\nexport const BACKOFF_DELAY_MS = 420;", 0.3, embedder),
              _block("file:api.ts#1", "export function byId(items, id) {\n  return items.find(id);\n}", 0.3, embedder),
              _block("file:notes.md#0", "We deploy on Mondays.\nThe cache is warm by default.", 0.3, embedder)]
    signal = RecallSignal(mode, query_text=query, query=embedder.embed_one(query), saved=blocks, residents=[],
                          embedder=embedder)
    best = max(blocks, key=signal.similarity)
    assert best.name == "file:api.ts#0"
    detail = signal.explain(best)
    assert detail["signal"] == mode and detail["bm25"] > 0 and detail["lexical_rank"] == 1
    assert ("dense_rank" in detail) == (mode == "fused")


def test_a_question_naming_the_module_meets_every_line_of_its_file_not_only_the_framing():
    """The second block of lib/db.py has no `db` in its text; its path carries it."""
    embedder = ConstantEmbedder()
    query = "How long does the DB helper wait before it gives up?"
    body = "def connect(host, port=5432, timeout_ms=750):\n    return open_link(host, port, timeout_ms)"
    blocks = [_block("file:lib/http.py#1", body.replace("5432", "8080").replace("750", "900"), 0.3, embedder,
                     file_name="lib/http.py"),
              _block("file:lib/db.py#1", body, 0.3, embedder, file_name="lib/db.py")]
    assert lexical_lines(blocks[1]) == [f"{line} lib/db.py" for line in block_lines(body)]
    signal = RecallSignal("fused", query_text=query, query=embedder.embed_one(query), saved=blocks, residents=[],
                          embedder=embedder)
    assert signal.explain(blocks[1])["lexical_rank"] == 1 and signal.explain(blocks[1])["bm25"] > 0
    assert signal.explain(blocks[0])["bm25"] == 0.0                  # lib/http.py: no term of the question


def test_fused_is_reciprocal_rank_fusion_over_both_full_lists():
    embedder = ConstantEmbedder()
    query = "How long until a login expires? SESSION_IDLE_MINUTES"
    blocks = [_block("file:a.py#0", "SESSION_IDLE_MINUTES = 30", 0.2, embedder),
              *[_block(f"file:n.py#{i}", f"def helper_{i}():\n    return {i}", 0.2, embedder) for i in range(4)]]
    signal = RecallSignal("fused", query_text=query, query=embedder.embed_one(query), saved=blocks, residents=[],
                          embedder=embedder)
    for block in blocks:
        detail = signal.explain(block)
        expected = 1 / (60 + detail["dense_rank"]) + 1 / (60 + detail["lexical_rank"])
        assert signal.similarity(block) == pytest.approx(expected)
    assert [signal.explain(b)["lexical_rank"] for b in blocks] == [1, 2, 2, 2, 2]     # no hit: tied after the last
