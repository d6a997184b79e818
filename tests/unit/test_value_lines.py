"""Only lines that hold a value set a block's dense score when the message asks for one (issue 46,
`recall_value_lines`): `value_lines.holds_value` on plain lines of a coding day, the dense rule on plain blocks (the
embedded text and line keys unchanged), and the memory passing the rule only for a message that asks."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
from helpers.rig import Rig
from helpers.word_embedder import CountingEmbedder

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory.recall_signals import RecallSignal, line_key
from evoke_engine.memory.value_lines import holds_value, value_line_scores
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit

HOLD = [
    "CACHE_TTL_SECONDS = 900",                               # a module constant
    "  replicas: 4",                                         # a YAML key
    "  driver: postgres",                                    # a YAML key with a word value
    'region = "ap-south-1"',                                 # a TOML key
    "debug = false",                                         # a literal word
    "export LOG_FORMAT=json",                                # an env line
    "enabled: true log_format: json",                        # two short YAML lines joined by block_lines
    "$ gunicorn app:server --workers 9 --timeout 45",        # a command line's flags
    "uvicorn main:app --host=0.0.0.0 --reload",              # --flag=value
    "tar -C /opt/releases -xzf build.tgz",                   # a short flag with its argument
    "  File \"orders/sync.py\", line 812, in push_batch",    # a stack frame
    "KeyError: 'customer_id'",                               # an error with a quoted literal
    "| staging | 3 nodes | us-east |",                       # a table row
    "| service | owner |",                                   # a header row has two cells too
    "Let's go with Caddy for the reverse proxy.",            # decisions stated in chat
    "We'll use SQLite for the local cache from now on.",
    "After some back and forth we decided to vendor the parser.",
    "OK, switching to pnpm for the monorepo.",
    "We're going to pin numpy below two.",
    "The build takes 7 minutes on the runner.",              # a number in prose
]
HOLD_NONE = [
    '"""Helpers for the shipping label printer."""',          # a docstring
    "import itertools",                                       # an import
    "from pathlib import Path",
    "def render_label(order, *, compact=False):",             # a bare def line
    "class LabelPrinter(BasePrinter):",                       # a bare class line
    "# keep this in sync with the printer firmware",          # a comment
    "client = session.client",                                # a binding, not a value
    "name: str",                                              # a field's type
    "except KeyError: pass",
    "That usually means the connection pool is exhausted under load.",   # prose without a value
    "Don't worry, it's only a warning and it's safe to ignore.",         # apostrophes are no quotes
    "Hash it with sha256 before you store it.",              # a digit inside a word is no number
    "Thanks, that makes sense.",
    "|---|---|",                                             # a table's rule row
    "What port does the admin panel listen on?",             # a question that asks
]


@pytest.mark.parametrize("line", HOLD)
def test_a_line_with_a_value_holds_one(line):
    assert holds_value(line)


@pytest.mark.parametrize("line", HOLD_NONE)
def test_a_line_without_a_value_holds_none(line):
    assert not holds_value(line)


def _block(name: str, lines: list[str], embedder, role: str = "file") -> Block:
    text = "\n".join(lines)
    b = Block(name=name, role=role, turn=1, tokens=[zlib.crc32(text.encode()) % 1000, len(text)], text=text,
              state=BlockState.RAM)
    b.embedding = embedder.embed_one(text)
    return b


QUESTION = "How many times does the mailer retry a bounce?"


def _day(embedder):
    # the question's topic in a docstring beats the fact's line on similarity; only the fact's line holds a value
    # (each line at least 24 characters: block_lines joins shorter ones to the next)
    topical = _block("file:mailer_docs#0", ['"""How the mailer handles a bounce, in short."""',
                                            "import smtplib  # the standard client"], embedder)
    fact = _block("file:outbox#1", ["MAILER_RETRY_BOUNCE = 6  # per message",
                                    "log = logging.getLogger(__name__)"], embedder)
    other = _block("file:invoice#2", ['"""How many times the invoice view rounds."""',
                                      "ROUNDING_DIGITS = 2  # cents, not mills"], embedder)
    return topical, fact, other


def test_only_value_lines_set_the_dense_score_when_on_and_the_embedded_text_is_the_same():
    plain_embedder, value_embedder = CountingEmbedder(), CountingEmbedder()    # each records the lines it embeds
    topical, fact, other = _day(CountingEmbedder())
    query = CountingEmbedder().embed_one(QUESTION)
    kw = {"query_text": QUESTION, "query": query, "residents": []}
    plain = RecallSignal("lines", saved=[topical, fact, other], embedder=plain_embedder, **kw)
    value = RecallSignal("lines", saved=[topical, fact, other], embedder=value_embedder, value_lines=True, **kw)
    assert plain.similarity(topical) > plain.similarity(fact)          # the docstring wins without the rule
    assert value.similarity(fact) > value.similarity(topical)          # only the constant's line counts with it
    assert value.similarity(fact) > value.similarity(other)
    assert "MAILER_RETRY_BOUNCE" in value.explain(fact)["best_line"] and value.explain(fact)["value_line"] is True
    assert str(value.explain(topical)["value_line"]).startswith("none")
    assert "value_line" not in plain.explain(fact)
    # the rule changes which similarities count, never what is embedded or the cache keys
    assert plain_embedder.texts == value_embedder.texts and value_embedder.texts
    assert line_key(fact, False, False, False) == fact.hash


def test_a_block_without_a_value_line_ranks_after_one_whose_value_line_matches_as_well():
    dense = {"prose": 0.5, "fact": 0.6, "code": 0.7}
    lines = {"prose": (["We talked about the mailer at length."], _sims(0.5)),
             "fact": (["MAILER_BOUNCE_RETRIES = 6", "Mailer notes for the team."], _sims(0.5, 0.6)),
             "code": (['"""The mailer, retried."""', "RETRY_BACKOFF_S = 30"], _sims(0.7, 0.3))}
    margin = value_line_scores(lines, dense)
    assert dense["fact"] == pytest.approx(0.5) and dense["code"] == pytest.approx(0.3)
    # the median gap between the best line and the best value line (0.1 and 0.4): 0.25
    assert margin == pytest.approx(0.25) and dense["prose"] == pytest.approx(0.25)
    tie = {"prose": 0.5, "fact": 0.5}
    value_line_scores({"prose": (["We talked about it."], _sims(0.5)), "fact": (["LIMIT = 6"], _sims(0.5))}, tie)
    assert tie["fact"] > tie["prose"]                                    # no gaps: a tie-break margin only


def _sims(*values: float):
    import numpy as np
    return np.array(values, dtype=np.float32)


def test_the_memory_applies_the_rule_only_when_on_the_message_asks_and_the_working_set_has_grown(tmp_path):
    assert Settings().recall_value_lines is True          # on by default: where the width grows (budgets over 1024)
    rig = Rig(tmp_path, recall_signal="lines", recovery_top_k=2)            # a budget of 200 tokens
    try:
        cases = [(False, QUESTION, 100, False), (True, "Here is the outbox module.", 100, False),
                 (True, QUESTION, 1024, False), (True, QUESTION, 100, True)]
        for on, message, per, expect in cases:
            settings = dataclasses.replace(rig.settings, recall_value_lines=on, recovery_width_tokens=per)
            memory = rig.memory(f"c{on}{per}{expect}", settings=settings)
            memory.embedder = CountingEmbedder()
            blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.1, 0.9, 0.9)]
            memory.end_turn()
            memory.evict_to(memory.active_tokens - 20)
            memory.embed_due()
            memory.turn += 1
            memory.set_query(message)
            plan = memory.plan_recovery(message, message_tokens=16, reply_reserve=16)
            assert ("value_line" in plan.signal.explain(blocks[0])) is expect, (on, message, per)
            memory.release()
    finally:
        rig.close()
