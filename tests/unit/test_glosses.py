"""The model's glosses of value lines (issue 61) on plain objects: which lines are glossed, the reply parsed, the book
(its digest in the line key, a KV file's round trip), the recall signals reading gloss lines only when asked, and the
writer's order, cap and stop when other work arrives (a stand-in `generate`: what llama.cpp does is the slow test's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers.rig import Rig
from helpers.word_embedder import CountingEmbedder

from evoke_engine.conversations.completion import Completion, HeldCompletion
from evoke_engine.conversations.gloss_writer import GlossWriter, blocks_to_gloss, embedded_model, writes_glosses
from evoke_engine.conversations.turn_jobs import TurnJobs
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory import lexical, recall_signals
from evoke_engine.memory.glosses import (
    BOOK,
    GLOSS_TOKENS_PER_BLOCK,
    GLOSS_VERSION,
    MAX_LINES_PER_BLOCK,
    GlossBook,
    gloss_messages,
    gloss_targets,
    glosses_of,
    parse_glosses,
)
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.memory.recall_signals import fact_lines, lexical_lines, line_key, line_vectors
from evoke_engine.memory.snapshot import Snapshot, decode_payload, encode_payload
from evoke_engine.settings import Settings

pytestmark = pytest.mark.unit
CODE = ("// timings of the dashboard and its polling loop\nexport const STATUS_REFRESH_MS = 4500;\n"
        "export function refresh() { return load(); }")


@pytest.fixture(autouse=True)
def empty_book():
    BOOK.clear()
    yield
    BOOK.clear()


def _block(text: str = CODE, state: BlockState = BlockState.RAM, turn: int = 1, name: str = "status.ts") -> Block:
    return Block(name=f"file:{name}#{turn}", role="file", turn=turn, tokens=[len(text), turn, 7], text=text,
                 file_name=name, state=state)


def test_only_short_value_lines_under_a_glued_name_are_glossed():
    lines = ['"autosaveDelayMs": 900,', "export const STATUS_REFRESH_MS = 4500;", "We met at 9 to talk.",
             "import os", "  retention_days: 14", "pytest --maxfail 3 tests", "x" * 250 + "_y = 1"]
    assert gloss_targets(lines) == lines[:2] + [lines[4], lines[5]]
    many = [f"LIMIT_{i} = {i}" for i in range(9)]
    assert gloss_targets(many) == many[:MAX_LINES_PER_BLOCK]


def test_a_name_given_a_number_is_glossed_first_and_a_name_only_called_never():
    calls = ["log.debug('load %s', item)", 'if item is None: raise ValueError("no export")']
    settings = ["shard_count = 23", "locust -f load/checkout.py --users 5090 --headless",
                "  grace_days INTEGER NOT NULL DEFAULT 7,", "  late_fee NUMERIC(6, 2) NOT NULL DEFAULT 12.50,",
                "ffmpeg -i in.mp4 -crf 48 out.mp4"]
    other = 'File "auth/tokens.py", line 643, in verify_signature'
    assert gloss_targets([*calls, other, *settings]) == settings[:MAX_LINES_PER_BLOCK]
    assert gloss_targets([*calls, other, settings[0]]) == [settings[0], other]
    assert gloss_targets(calls) == []


def test_the_prompt_numbers_the_lines():
    messages = gloss_messages(["A_B = 1", "  c_d: 2"])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].endswith("\n\n1. A_B = 1\n2. c_d: 2")


def test_the_prompt_shows_the_block_the_lines_come_from_cut_at_a_line():
    section = "worker:\n  replicas: 3\n  drain_grace_seconds: 2795\n"
    asked = gloss_messages(["drain_grace_seconds: 2795"], "deploy/worker.yaml", section)[1]["content"]
    assert asked.startswith("Where the lines come from (deploy/worker.yaml):\n```\nworker:\n  replicas: 3\n")
    assert asked.endswith("\n\n1. drain_grace_seconds: 2795")
    long = "\n".join(f"line_{i} = {i}" for i in range(200))
    shown = gloss_messages(["line_0 = 0"], "", long)[1]["content"]
    assert "line_0 = 0\n" in shown and "line_199" not in shown and "\n...\n```" in shown
    assert "(" not in shown.split("\n")[0]                # no file: no name in brackets


def test_a_numbered_reply_gives_one_gloss_a_line_and_drops_the_rest():
    lines = ["A_B = 1", "C_D = 2", "E_F = 3"]
    reply = ("Sure!\n1. `how long the page waits, in milliseconds`.\n2) C_D = 2\n7. out of range\n"
             "1. a second answer to line one\n3: " + "very " * 40 + "long")
    glosses = parse_glosses(reply, lines)
    assert glosses["A_B = 1"] == "how long the page waits, in milliseconds"
    assert "C_D = 2" not in glosses                                      # it only repeats its line
    assert len(glosses["E_F = 3"]) <= 120 and glosses["E_F = 3"].startswith("very very")
    assert parse_glosses("I cannot help with that.", lines) == {}
    assert parse_glosses("1. export const STATUS_REFRESH_MS = 450;\n2. autosaveDelayMs: 900", lines) == {}
    assert parse_glosses("1. 1. how long\n2. how long\n3. the page's wait", lines) == {"E_F = 3": "the page's wait"}


def test_a_reply_in_bullets_glosses_one_line_with_all_of_them_and_several_lines_one_a_line():
    one = ['[profile] log_level = "info" shard_count = 23']
    reply = ('- Log level is set to "info" for detailed information.\n- Shard count is set to 23, which means the '
             'application will use 23 shards.\n\n2. [profile] log_level = "debug" shard_count = 10')
    gloss = parse_glosses(reply, one)[one[0]]           # the "2." is the model's own example: out of range
    assert gloss.startswith('Log level is set to "info" for detailed information; Shard count is set to 23')
    assert len(gloss) <= 120
    assert parse_glosses("This sets how often the page reloads.\nAnything else?", ["A_B = 1"]) == {
        "A_B = 1": "This sets how often the page reloads"}
    two = ["A_B = 1", "C_D = 2"]
    assert parse_glosses("- the first thing here\n- the second thing here", two) == {
        "A_B = 1": "the first thing here", "C_D = 2": "the second thing here"}
    assert parse_glosses("- the first thing here\n- more\n- and more of it", two) == {}   # not one a line


def test_the_book_digest_changes_with_the_glosses_and_a_block_without_any_keeps_its_key():
    book = GlossBook(capacity=2)
    book.put("h1", {"A_B = 1": "one thing"})
    first = book.suffix("h1")
    book.put("h1", {"A_B = 1": "another thing"})
    assert first.startswith(f"|g{GLOSS_VERSION}.") and book.suffix("h1") != first
    book.put("h2", {})
    assert book.written("h2") and book.suffix("h2") == "" and book.lines("h2") == []
    book.put("h3", {"X_Y = 2": "x"})
    assert not book.written("h1") and len(book) == 2                    # least recently put leaves first
    assert book.lines("h3") == ["x: X_Y = 2"]


def test_a_kv_file_keeps_the_glosses_and_an_older_file_has_none():
    block = _block()
    BOOK.put(block.hash, {"export const STATUS_REFRESH_MS = 4500;": "how often the status page reloads"})
    snapshot = Snapshot(conversation_id="c", prefix_key="p", turn=1, budget_tokens=512, history=[], blocks=[],
                        image=None, glosses=BOOK.export([block.hash, "unknown"]))
    read = decode_payload(encode_payload(snapshot))
    assert read.glosses == {block.hash: [["export const STATUS_REFRESH_MS = 4500;",
                                          "how often the status page reloads"]]}
    BOOK.clear()
    assert BOOK.seed(read.glosses) == 1 and BOOK.lines(block.hash) == \
        ["how often the status page reloads: export const STATUS_REFRESH_MS = 4500;"]
    assert glosses_of(None) == {}
    with pytest.raises(ValueError):
        glosses_of({"h": [["only one"]]})


def test_the_signals_read_gloss_lines_only_when_asked():
    block = _block()
    assert line_key(block, glosses=True) == block.hash                    # none written: the key as before
    BOOK.put(block.hash, {"export const STATUS_REFRESH_MS = 4500;": "how often the status page reloads itself"})
    assert line_key(block) == block.hash and line_key(block, glosses=True) == block.hash + BOOK.suffix(block.hash)
    assert fact_lines(block)[-1] != fact_lines(block, glosses=True)[-1]
    assert fact_lines(block, glosses=True)[-1].startswith("how often the status page reloads itself: export const")
    asked = "How often does the page reload itself?"
    assert lexical.bm25_lines({"b": lexical_lines(block)}, asked) == {}
    assert lexical.bm25_lines({"b": lexical_lines(block, glosses=True)}, asked)["b"] > 0
    embedder = CountingEmbedder()
    line_vectors(embedder, [block], glosses=True)
    assert any(text.startswith("how often the status page reloads itself") for text in embedder.texts)


def test_with_gloss_alone_a_glossed_lines_vector_is_made_of_its_gloss_and_its_key_says_so(monkeypatch):
    block = _block()
    gloss = "how often the status page reloads itself"
    BOOK.put(block.hash, {"export const STATUS_REFRESH_MS = 4500;": gloss})
    together = line_key(block, glosses=True)
    monkeypatch.setattr(recall_signals, "GLOSS_ALONE", True)
    assert line_key(block, glosses=True) == together + "|a1" and line_key(block) == block.hash
    embedder = CountingEmbedder()
    lines = line_vectors(embedder, [block], glosses=True)[together + "|a1"][0]
    assert lines[-1].startswith(gloss + ": export const")             # still the block's value line, whole
    assert gloss in embedder.texts and not any(t.startswith(gloss + ":") for t in embedder.texts)


def test_auto_writes_glosses_except_with_the_embedded_tiny_model():
    assert embedded_model(Settings()) and embedded_model(Settings(model_path="/x/SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert not writes_glosses(Settings(recall_glosses="auto"))
    assert writes_glosses(Settings(recall_glosses="auto", model_path="/m/qwen2.5-coder-7b-q4_k_m.gguf"))
    assert writes_glosses(Settings(recall_glosses="on")) and writes_glosses(Settings(model_path="/m/q.gguf"))
    assert not writes_glosses(Settings(recall_glosses="off", model_path="/m/q.gguf")) and not writes_glosses(Settings())


def test_evicted_blocks_are_glossed_first_newest_first_then_the_next_to_be_evicted():
    old, new = _block(turn=1, name="a.ts"), _block(turn=2, name="b.ts")
    keep, next_out = _block(state=BlockState.RESIDENT, turn=3, name="c.ts"), \
        _block(state=BlockState.RESIDENT, turn=4, name="d.ts")
    prose = _block("We talked about lunch at noon today, nothing else.", turn=5, name="e.md")
    shared = _block(turn=6, name="f.ts")
    shared.shared = True
    done = _block(turn=7, name="g.ts")
    BOOK.put(done.hash, {})
    score = {keep: 0.9, next_out: 0.1}
    assert blocks_to_gloss([old, new, keep, next_out, prose, shared, done], score.get) == [new, old, next_out, keep]


class _Model:
    """What the writer reads of a loaded model (its settings, template, tokenizer); `generate` stands in for it."""

    def __init__(self, mode: str = "on") -> None:
        self.closed = False
        self.settings = Settings(recall_glosses=mode)
        self.template = SimpleNamespace(render=lambda messages, add_generation_prompt: messages[-1]["content"])
        self.rt = SimpleNamespace(tokenize=lambda text, **_: list(range(len(text.split()))))


def _memory(blocks: list[Block]) -> SimpleNamespace:
    embedded: list[Block] = []
    return SimpleNamespace(table=SimpleNamespace(blocks=blocks), score=lambda b: 0.0, embedded=embedded,
                           embed_glossed=embedded.extend)


def test_the_writer_glosses_each_block_once_within_its_cap():
    asked: list[int] = []

    def generate(model, tokens, params, on_token, cancel, **_):
        asked.append(params.max_tokens)
        return Completion("1. how often the status page reloads, in milliseconds", len(tokens), 12, "eos", 0.01)

    blocks = [_block(turn=t, name=f"{t}.ts") for t in range(3)]
    memory = _memory(blocks)
    writer = GlossWriter(lambda: False, generate=generate)
    cost = writer.write(_Model(), memory)
    assert cost.blocks == 3 and cost.glossed_lines == 3 and cost.reply_tokens == 36 and cost.interrupted == 0
    assert asked == [GLOSS_TOKENS_PER_BLOCK] * 3 and memory.embedded == blocks[::-1]
    assert BOOK.lines(blocks[0].hash) == \
        ["how often the status page reloads, in milliseconds: export const STATUS_REFRESH_MS = 4500;"]
    assert writer.write(_Model(), memory).blocks == 0                   # written once
    assert writer.write(_Model("auto"), _memory([_block(turn=9)])).blocks == 0     # the embedded model: off


def test_work_that_arrives_stops_the_writer_and_a_cut_reply_keeps_nothing():
    arrived = [False]

    def generate(model, tokens, params, on_token, cancel, **_):
        assert not cancel.is_set()
        arrived[0] = True                                  # a turn is queued while this block's reply is written
        assert cancel.is_set()                             # the next decode sees it
        return Completion("1. half a gl", len(tokens), 3, "cancelled", 0.01)

    blocks = [_block(turn=t, name=f"{t}.ts") for t in range(3)]
    writer = GlossWriter(lambda: arrived[0], generate=generate)
    cost = writer.write(_Model(), _memory(blocks))
    assert cost.interrupted == 1 and cost.blocks == 0 and len(BOOK) == 0
    arrived[0] = False
    writer.generate = lambda *a, **_: Completion("1. how often it reloads", 5, 5, "eos", 0.0)
    assert writer.write(_Model(), _memory(blocks)).blocks == 3 and writer.total.interrupted == 1


def test_a_cut_block_goes_on_first_from_its_held_cells_and_only_for_the_model_that_decoded_them():
    arrived, resumes = [False], []

    def generate(model, tokens, params, on_token, cancel, *, resume=None, hold=None):
        resumes.append(resume)
        if arrived[0]:
            hold(HeldCompletion(tuple(tokens[:3]), b"cells"))           # three tokens decoded when the turn came
            return Completion("", len(tokens), 0, "cancelled", 0.0, 3)
        prefilled = None if resume is None else len(tokens) - len(resume.tokens) + 1
        return Completion("1. how often it reloads", len(tokens), 5, "eos", 0.0, prefilled)

    model, blocks = _Model(), [_block(turn=t, name=f"{t}.ts") for t in range(3)]
    writer = GlossWriter(lambda: False, generate=generate)
    arrived[0] = True
    first = writer.write(model, _memory(blocks))
    assert first.interrupted == 1 and first.prompt_tokens == 3 and len(BOOK) == 0
    arrived[0] = False
    memory = _memory([*blocks, _block(turn=7, name="7.ts")])         # saved since: newest, yet after the cut one
    cost = writer.write(model, memory)
    assert cost.blocks == 4 and cost.resumed == 1 and memory.embedded[0] is blocks[-1]
    assert resumes[1] is not None and resumes[1].cells == b"cells" and resumes[2:] == [None] * 3
    BOOK.clear()
    resumes.clear()
    arrived[0] = True
    writer.write(model, _memory(blocks))
    arrived[0] = False
    writer.write(_Model(), _memory(blocks))                             # another model: the cells are not put back
    assert resumes[1] is None and len(BOOK) == 3


def test_the_writer_comes_back_after_the_work_that_stopped_it_and_past_its_quota_but_never_spins():
    """`TurnJobs.write_glosses` queues itself again after a run that decoded something and stopped for a queued job
    or at its quota; not after one stopped before its first decode (a reply streams) nor one with nothing left."""
    arrived, asked = [False], [0]

    def generate(model, tokens, params, on_token, cancel, **_):
        asked[0] += 1
        if asked[0] == 2:                                   # a turn is queued while the second block is written
            arrived[0] = True
            return Completion("", len(tokens), 0, "cancelled", 0.0)
        return Completion("1. how often it reloads", len(tokens), 5, "eos", 0.0)

    blocks = [_block(turn=t, name=f"{t}.ts") for t in range(5)]
    state = SimpleNamespace(memory=_memory(blocks))
    queued: list = []
    writer = GlossWriter(lambda: arrived[0], generate=generate, blocks_per_run=2)
    turns = TurnJobs(SimpleNamespace(history=None, get=lambda _: state, model=_Model()), emit=print,
                     clock=lambda: 0.0, on_activity=print, on_idle=queued.append, glosses=writer)
    turns.write_glosses("c1")
    assert len(BOOK) == 1 and writer.total.interrupted == 1 and len(queued) == 1    # after the turn, on idle time
    queued.pop()()                                         # the turn still waits: stopped before any decode
    assert len(BOOK) == 1 and queued == [] and writer.total.runs == 2
    arrived[0] = False
    turns.write_glosses("c1")                              # the next turn's end: two blocks, the quota, then more
    assert len(BOOK) == 3 and len(queued) == 1
    queued.pop()()
    assert len(BOOK) == 5 and len(queued) == 1
    queued.pop()()                                         # nothing left: not queued again
    assert queued == [] and writer.total.blocks == 5 and writer.total.runs == 5
    assert writer.total.wall_s >= writer.total.model_s + writer.total.embed_s >= 0


def test_a_conversations_kv_file_carries_its_glosses_and_their_line_vectors(tmp_path):
    """The glosses are kept with the block in the KV file; a reopen in a fresh process (an empty book, a new
    embedder) reads them and adopts their line vectors: the first turn after it embeds only its message."""
    rig = Rig(tmp_path, recall_signal="lines", recovery_top_k=2, recall_glosses="on")
    try:
        memory = rig.memory()
        memory.embedder = CountingEmbedder()
        blocks = [rig.add(memory, "file", 16, priority=p) for p in (0.1, 0.1, 0.9, 0.9, 0.9, 0.9)]
        BOOK.put(blocks[0].hash, {"POLL_MS = 4500": "how often the page reloads itself"})
        memory.end_turn()
        memory.evict_to(memory.active_tokens - 20)
        assert any(t.startswith("how often the page reloads itself") for t in memory.embedder.texts)
        memory.park()
        payload = encode_payload(memory.snapshot("prefix", [{"role": "user", "content": "x", "evoke_turn": 1}]))
        memory.release()
        BOOK.clear()
        embedder = CountingEmbedder()
        loaded = ConversationMemory("c2", settings=rig.settings, runtime=rig.rt, kv=rig.kv, pool=rig.pool,
                                    embedder=embedder, emit=rig.events.append)
        loaded.load_snapshot(decode_payload(payload), rig.prefix_tokens)
        assert BOOK.lines(blocks[0].hash) == ["how often the page reloads itself: POLL_MS = 4500"]
        rig.enter_slot(loaded, 1)
        loaded.turn += 1
        loaded.set_query("how often does it reload?")
        loaded.recover("how often does it reload?", message_tokens=16, reply_reserve=16)
        assert embedder.texts == ["how often does it reload?"]
    finally:
        rig.close()
