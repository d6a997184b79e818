"""A structured line embedded with its context (issue 46, fourth part): `line_context.spell_out` on plain strings, the
line signal's use of it behind `recall_line_context`, and a KV file's line vectors of the old text never taken for
the spelled-out ones (the version is part of the line key; an older file still opens, its lines are embedded again
off the turn)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.rig import Rig
from helpers.word_embedder import CountingEmbedder

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory.line_context import file_words, identifier_words, parents, spell_command, spell_out
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.memory.recall_signals import (
    LINE_CONTEXT_VERSION,
    cached_lines,
    export_lines,
    fact_lines,
    line_key,
    line_vectors,
    seed_lines,
)
from evoke_engine.memory.snapshot import decode_payload, encode_payload

pytestmark = pytest.mark.unit

HISTORY = [{"role": "user", "content": "x", "evoke_turn": 1}]
QUESTION = "which value does file_1.2.3 hold?"


YAML = "database:\n  enabled: true\n  pool_size: 20\nhttp:\n  bind: 0.0.0.0"
TOML = '[invoice]\nmode = "production"\npool_size = 42\n\n[http]\ntls = true'
MODULE = ('"""Helpers for invoice handling."""\nimport logging\nlog = logging.getLogger(__name__)\n'
          "RECONNECT_JITTER_MS = 420\n\ndef load(item):\n    if item == 1:\n        return item")


@pytest.mark.parametrize("name, words", [("max_retries", "max retries"), ("MAX_RETRIES", "max retries"),
                                         ("maxRetries", "max retries"), ("--max-retries", "max retries"),
                                         ("HTTPServerPort", "http server port"), ("db.pool_size", "db pool size")])
def test_identifiers_are_split_into_words(name, words):
    assert identifier_words(name) == words


def test_a_yaml_key_reads_its_file_and_parent_keys():
    lines = spell_out(YAML, "deploy/database.yaml").splitlines()
    assert lines[0] == "database:"                                  # a parent alone states no value
    assert lines[2] == "deploy database yaml database pool size: 20"
    assert lines[4] == "deploy database yaml http bind: 0.0.0.0"
    assert file_words("deploy/database.yaml") == "deploy database yaml"


def test_nested_yaml_parents_come_outermost_first_and_may_sit_in_the_text_before():
    text = "service:\n  limits:\n    cpu: 2\n  name: api"
    assert parents(text.splitlines(), 2) == ["service", "limits"]
    assert parents(text.splitlines(), 3) == ["service"]
    assert spell_out("    max_body_kb: 512", "k8s.yaml", before=text) == "k8s yaml service limits max body kb: 512"


def test_a_toml_key_reads_its_section():
    lines = spell_out(TOML, "config/invoice.toml").splitlines()
    assert lines[2] == "config invoice toml invoice pool size = 42"
    assert lines[5] == "config invoice toml http tls = true"
    assert lines[0] == "[invoice]" and lines[3] == ""                # same lines, same order


def test_a_module_constant_and_an_env_line_are_spelled_out_code_is_not():
    lines = spell_out(MODULE, "services/invoice_load.py").splitlines()
    assert lines[3] == "services invoice load py reconnect jitter ms = 420"
    assert lines[2] == "log = logging.getLogger(__name__)"          # not a scalar value
    assert lines[6] == "    if item == 1:"
    assert spell_out("STRIPE_WEBHOOK_TOLERANCE_SECONDS=300") == "stripe webhook tolerance seconds = 300"


def test_a_command_lines_flags_are_words_with_their_values():
    assert spell_command("$ pytest -n 12 --maxfail 3 tests/integration") == \
        "command pytest: n 12, maxfail 3, tests/integration"
    assert spell_command("python -m trainer --warmup-steps 420 --lr 3e-4") == \
        "command python: m trainer, warmup steps 420, lr 3e-4"
    assert spell_command("rsync -az --bwlimit=900 dist/ edge:/srv") == \
        "command rsync: az, bwlimit 900, dist/, edge:/srv"
    assert spell_command("wrk -t4 -c400 http://localhost:8080/") == "command wrk: t 4, c 400, http://localhost:8080/"


@pytest.mark.parametrize("line", ["Decision: we cap the export queue at 42 jobs.", "| eu-west | 42 GB |",
                                  "OSError: [Errno 24] Too many open files (limit 42)", "I'm running this now:",
                                  "Traceback (most recent call last):", "Use `ss -ltnp` to list them.", ""])
def test_prose_tables_and_traces_are_left_as_written(line):
    assert spell_out(line, "notes.md") == line


def _file_block(text: str, name: str = "deploy/database.yaml") -> Block:
    return Block(name=f"file:{name}#0", role="file", turn=1, tokens=[len(text), 7], text=text, file_name=name,
                 state=BlockState.RAM)


def test_the_line_signal_embeds_the_spelled_out_line_only_when_asked():
    block = _file_block(YAML)
    assert "pool_size: 20" in " ".join(fact_lines(block))
    assert any("database pool size: 20" in line for line in fact_lines(block, line_context=True))
    assert line_key(block) == block.hash
    assert line_key(block, line_context=True) == f"{block.hash}|c{LINE_CONTEXT_VERSION}"
    embedder = CountingEmbedder()
    line_vectors(embedder, [block], line_context=True)
    assert any("deploy database yaml database pool size: 20" in text for text in embedder.texts)


def test_vectors_of_the_written_line_are_not_taken_for_the_spelled_out_one():
    """What a KV file of a build before the lever carries (keys without the version) is adopted, but a decision
    with the lever on finds none of it and the lines are embedded again, spelled out."""
    block = _file_block(YAML)
    old = CountingEmbedder()
    line_vectors(old, [block])
    stored = export_lines(old, [block])
    assert list(stored) == [block.hash]
    fresh = CountingEmbedder()
    assert seed_lines(fresh, stored) == 1
    assert cached_lines(fresh, [line_key(block)]) != {}                            # the lever off: reused
    assert cached_lines(fresh, [line_key(block, line_context=True)]) == {}        # on: not taken for the new text
    assert fresh.texts == []
    line_vectors(fresh, [block], line_context=True)
    assert any("database pool size: 20" in text for text in fresh.texts)


def test_a_file_written_without_the_lever_opens_and_its_lines_are_embedded_again_off_the_turn(tmp_path):
    rig = Rig(tmp_path, recall_signal="lines", recovery_top_k=2)
    try:
        memory = rig.memory()
        memory.embedder = CountingEmbedder()
        blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.1, 0.9, 0.9)]
        memory.end_turn()
        memory.evict_to(memory.active_tokens - 20)
        assert blocks[0].state is BlockState.RAM
        memory.park()
        payload = encode_payload(memory.snapshot("prefix", HISTORY))
        memory.release()
        assert all("|c" not in key for key in decode_payload(payload).lines)

        settings = dataclasses.replace(rig.settings, recall_line_context=True)
        embedder = CountingEmbedder()
        loaded = ConversationMemory("c2", settings=settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                    embedder=embedder, emit=rig.events.append)
        loaded.load_snapshot(decode_payload(payload), rig.prefix_tokens)
        rig.enter_slot(loaded, 1)
        loaded.turn += 1
        loaded.set_query(QUESTION)
        loaded.recover(QUESTION, message_tokens=16, reply_reserve=16)
        assert embedder.texts == [QUESTION]                 # the decision embeds no line (old ones are not used)
        loaded.end_turn()
        loaded.embed_due()                                  # off the turn: every block's lines, the new text
        assert len(embedder.texts) > 1
        loaded.park()
        written = decode_payload(encode_payload(loaded.snapshot("prefix", HISTORY))).lines
        assert any(key.endswith(f"|c{LINE_CONTEXT_VERSION}") for key in written)
    finally:
        rig.close()
