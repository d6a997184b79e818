"""Recovery signals on plain blocks: line max-similarity, FTS5 BM25, rank fusion, the user margin,
explanations. The embedder here is a bag-of-words stand-in (no model): these tests are logic."""

from __future__ import annotations

import zlib

import pytest
from helpers.word_embedder import CountingEmbedder

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory.policy import choose_recoveries
from evoke_engine.memory.recall_signals import (
    RecallSignal,
    asks_for_value,
    block_lines,
    bm25_by_block,
    fact_lines,
    line_vectors,
    query_terms,
)

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


class WordsEmbedder(CountingEmbedder):
    """`CountingEmbedder` over 256 dimensions (cosine is word overlap); `embedded` counts the texts embedded in
    batches (line vectors), not the message's own vector."""

    def __init__(self) -> None:
        super().__init__(dims=256)
        self.embedded = 0

    def embed(self, texts):
        self.embedded += len(texts)
        return super().embed(texts)

    def embed_one(self, text):
        return self._vector(text)


FILLER = ["The README explains how to run the tests locally.", "Docker images are rebuilt weekly.",
          "Secrets never go into the repository.", "Linting runs before every commit.",
          "Old branches are deleted after merge.", "Dashboards are reviewed in the Monday meeting."]


def block(name: str, text: str, role: str = "file", embedder=None, state=BlockState.RAM) -> Block:
    b = Block(name=name, role=role, turn=1, tokens=[zlib.crc32(text.encode()) % 1000, len(text)], text=text,
              state=state)
    if embedder is not None:
        b.embedding = embedder.embed_one(text)
    return b


def test_block_lines_drop_template_markup_and_join_short_lines():
    text = "<|im_start|>user\n[file NOTES.md]\n# Notes\nOK\nThe cache keeps entries for 354 minutes.\n<|im_end|>"
    lines = block_lines(text)
    assert all("<|" not in line for line in lines)
    assert "user" not in lines
    assert any("354 minutes" in line for line in lines)
    assert all(len(line) >= 24 for line in lines[:-1])


def test_bm25_ranks_the_line_with_the_rare_query_word_first():
    lines = {"a": FILLER, "b": [*FILLER[:3], "The staging API lives at https://staging.example.net/api."],
             "c": ["Staging mirrors production as closely as possible.", *FILLER[3:]]}
    scores = bm25_by_block(lines, "Which URL do we use for the staging api?")
    assert max(scores, key=scores.get) == "b"
    assert "a" not in scores                         # no shared word: no lexical score at all
    assert query_terms("What is the exact value? Answer with it.") == ["value"]


def test_block_mode_reproduces_one_vector_per_block_cosine():
    emb = WordsEmbedder()
    saved = [block("file:a#0", "cache entries expire after minutes", embedder=emb),
             block("file:a#1", "\n".join(FILLER), embedder=emb)]
    query = emb.embed_one("when do cache entries expire")
    signal = RecallSignal("block", query_text="when do cache entries expire", query=query, saved=saved,
                          residents=[], embedder=emb)
    for b in saved:
        assert signal.similarity(b) == pytest.approx(float(b.embedding @ query))
    assert emb.embedded == 0                         # no line vectors in block mode


def test_a_one_line_fact_among_unrelated_lines_wins_on_line_max_similarity():
    emb = WordsEmbedder()
    fact = block("file:notes#1", "\n".join([*FILLER, "Nightly reports land in /srv/kestrel/tundra."]), embedder=emb)
    topical = block("file:notes#0", "Report writers meet nightly.\nThe nightly digest is long.\nReports and "
                    "more reports.", embedder=emb)
    message = "Where do nightly reports land?"
    query = emb.embed_one(message)
    by_block = RecallSignal("block", query_text=message, query=query, saved=[fact, topical], residents=[],
                            embedder=emb)
    by_line = RecallSignal("lines", query_text=message, query=query, saved=[fact, topical], residents=[],
                           embedder=emb)
    assert by_block.similarity(topical) > by_block.similarity(fact)     # the average dilutes the fact
    assert by_line.similarity(fact) > by_line.similarity(topical)
    assert "kestrel" in by_line.explain(fact)["best_line"]


def test_fusion_explains_both_ranks_and_the_gate_uses_fused_scores():
    emb = WordsEmbedder()
    fact = block("file:cfg#2", "\n".join([*FILLER, "compression = zstd    # codec used for the event archive"]),
                 embedder=emb)
    other = block("file:cfg#0", "\n".join(FILLER[::-1]), embedder=emb)
    resident = block("user#3", "Write a Python function that merges two sorted lists.", role="user",
                     embedder=emb, state=BlockState.RESIDENT)
    message = "Which codec squeezes the stored event history?"
    signal = RecallSignal("lines+lexical", query_text=message, query=emb.embed_one(message), saved=[fact, other],
                          residents=[resident], embedder=emb)
    detail = signal.explain(fact)
    assert detail["dense_rank"] == 1 and detail["lexical_rank"] == 1 and detail["bm25"] > 0
    assert signal.similarity(fact) > signal.similarity(other)
    picks = choose_recoveries([fact, other], message=message, similarity=signal.similarity,
                              resident_best=signal.resident_best, top_k=1, room_tokens=100)
    assert [p.block for p in picks] == [fact]


def test_a_saved_user_message_comes_back_only_as_the_best_match_by_a_margin():
    emb = WordsEmbedder()
    ask = block("user#1", "Here are some files from my project. Please read them and reply OK.", role="user",
                embedder=emb)
    fact = block("file:notes#0", "\n".join([*FILLER, "The project files are owned by Ngozi Okafor."]), embedder=emb)
    message = "Who owns the project files? Please reply."
    query = emb.embed_one(message)
    loose = RecallSignal("lines", query_text=message, query=query, saved=[ask, fact], residents=[], embedder=emb)
    strict = RecallSignal("lines", query_text=message, query=query, saved=[ask, fact], residents=[], embedder=emb,
                          user_margin=0.5)
    assert loose.similarity(ask) > 0
    assert strict.similarity(ask) == -1.0 and strict.explain(ask)["user_margin_blocked"]
    chat = block("user#2", "By the way the standup moved to the blue room.", role="user", embedder=emb)
    message = "Where is the standup now, the blue room?"
    alone = RecallSignal("lines", query_text=message, query=emb.embed_one(message), saved=[chat, fact],
                         residents=[], embedder=emb, user_margin=0.2)
    assert alone.similarity(chat) > 0                # the best match by far: allowed


def test_line_vectors_are_cached_per_embedder_by_content_hash():
    first, second = WordsEmbedder(), WordsEmbedder()
    b = block("file:x#0", "\n".join(FILLER))
    line_vectors(first, [b])
    line_vectors(first, [b, block("file:x#0", "\n".join(FILLER))])     # same content: no new work
    assert first.embedded == len(block_lines(b.text))
    line_vectors(second, [b])
    assert second.embedded == first.embedded


def test_an_unknown_signal_lists_the_valid_ones():
    with pytest.raises(ValueError, match="lines\\+lexical"):
        RecallSignal("attention", query_text="", query=None, saved=[], residents=[], embedder=WordsEmbedder())


def test_a_files_name_is_a_line_of_its_blocks_only_when_asked():
    """`file_names`: a question naming what the file is (the docker image) meets a block whose own lines never say
    it; off, the block keeps only its own lines. Cached apart, so one embedder serves both."""
    emb = WordsEmbedder()
    expose = block("file:Dockerfile#1", "EXPOSE 7311\nUSER app")
    expose.file_name = "docker/api.Dockerfile"
    other = block("file:notes#0", "The proxy settings live in a separate repo, ask ops about the port.")
    message = "Which port does our docker image open?"
    plain = RecallSignal("lines", query_text=message, query=emb.embed_one(message), saved=[expose, other],
                         residents=[], embedder=emb)
    named = RecallSignal("lines", query_text=message, query=emb.embed_one(message), saved=[expose, other],
                         residents=[], embedder=emb, file_names=True)
    assert plain.similarity(expose) < plain.similarity(other)
    assert named.similarity(expose) > named.similarity(other)
    assert named.explain(expose)["best_line"] == "file docker api Dockerfile"
    assert line_vectors(emb, [other], file_names=True).keys() == {other.hash}        # not a file: its lines only


@pytest.mark.parametrize(("line", "asks"), [
    ("Quick one: How long does the edge wait on a slow backend answer? One word or number is fine.", True),
    ("Which helper verifies a login secret?", True),
    ("what does `set -euo pipefail` do in bash?", True),
    ("did I mention the release freeze starts in June?", False),             # polar: it asserts what it asks
    ("sanity check: the load balancer idle timeout is 9517 seconds now, right?", False),
    ("Why is the pool 40 when the database allows 100?", False),            # a number: it may state one
    ("How long does the proxy wait; I think 30 s?", False),
    ("The proxy waits 30 seconds before it gives up.", False),              # no question at all
    ("Where the cache lives is in the notes.", False),
])
def test_a_question_that_asks_for_a_value_holds_none(line, asks):
    assert asks_for_value(line) is asks


@pytest.mark.parametrize("mode", ["lines", "fused"])
def test_an_old_question_no_longer_outranks_the_block_that_answers_it(mode):
    """The user asked the same thing earlier (people repeat themselves, and a probe shares its wording); that
    question holds no value, so with `skip_questions` the fact's block ranks first. A fact the user stated as a
    yes/no question still counts."""
    emb = WordsEmbedder()
    asked = block("user#4", "Quick one: how long does the proxy wait for a slow upstream? Short answer.",
                  role="user", embedder=emb)
    fact = block("file:nginx#0", "\n".join([*FILLER, "proxy_read_timeout 45s;"]), embedder=emb)
    stated = block("user#6", "did I mention the proxy upstream wait is 45 seconds now?", role="user", embedder=emb)
    message = "Quick one: how long does the proxy wait on a slow upstream? Short answer."
    query = emb.embed_one(message)
    plain = RecallSignal(mode, query_text=message, query=query, saved=[asked, fact], residents=[], embedder=emb)
    skip = RecallSignal(mode, query_text=message, query=query, saved=[asked, fact], residents=[], embedder=emb,
                        skip_questions=True)
    assert plain.similarity(asked) > plain.similarity(fact)
    assert skip.similarity(fact) > skip.similarity(asked)
    assert fact_lines(asked, skip_questions=True) == [] and fact_lines(stated, skip_questions=True)
    kept = RecallSignal(mode, query_text=message, query=query, saved=[asked, stated], residents=[], embedder=emb,
                        skip_questions=True)
    assert kept.similarity(stated) > kept.similarity(asked)


def test_line_vectors_key_a_user_message_apart_when_its_questions_are_skipped():
    emb = WordsEmbedder()
    mixed = block("user#2", "The deploy window is Tuesday now.\nWhere do I find the runbook for it?", role="user")
    plain = line_vectors(emb, [mixed])
    skipped = line_vectors(emb, [mixed], skip_questions=True)
    assert plain.keys() != skipped.keys()
    assert [lines for lines, _ in skipped.values()] == [["The deploy window is Tuesday now."]]
    assert len(next(iter(plain.values()))[0]) == 2


def test_a_query_made_meanwhile_scores_as_the_vector_itself():
    """The engine passes the message's vector as a callable (`Embedder.embed_soon` made it beside the lexical
    signal): asked for once, after the lexical part, and every score and explanation as with the vector."""
    emb = WordsEmbedder()
    fact = block("file:cfg#2", "\n".join([*FILLER, "compression = zstd    # codec used for the event archive"]),
                 embedder=emb)
    other = block("file:cfg#0", "\n".join(FILLER[::-1]), embedder=emb)
    message = "Which codec squeezes the stored event history?"
    asked: list[str] = []

    def later():
        asked.append(message)
        return emb.embed_one(message)
    kw = {"query_text": message, "saved": [fact, other], "residents": [], "embedder": emb}
    eager = RecallSignal("lines+lexical", query=emb.embed_one(message), **kw)
    lazy = RecallSignal("lines+lexical", query=later, **kw)
    assert asked == [message]
    assert lazy.score_of == eager.score_of and lazy.explain(fact) == eager.explain(fact)
