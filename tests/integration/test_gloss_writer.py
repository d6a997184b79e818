"""The engine's gloss writer on the real embedded model (issue 61), as wired (`recall_glosses=on`: each turn's end
queues it on idle time): glosses written through llama.cpp in the scratch sequence within the per-block cap, each
block once, its totals on the writer; a turn submitted while a gloss is decoding starts after at most one more decode,
and the block cut short is glossed at the next idle time."""

from __future__ import annotations

import queue
import threading

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.conversations.gloss_writer import GlossCost
from evoke_engine.memory.glosses import BOOK, GLOSS_TOKENS_PER_BLOCK

pytestmark = pytest.mark.slow
CODE = ("// timings of the dashboard and its polling loop\nexport const STATUS_REFRESH_MS = 4500;\n"
        '"autosaveDelayMs": 900,\nexport const MAX_TOAST_STACK = 4;\n')
WAIT_S = 180


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("glosses")), budget_tokens=1024, n_ctx=4096,
                        embedder="off", recall_glosses="on")
    with Engine(settings, prewarm=False) as eng:
        yield eng


@pytest.fixture
def runs(engine):
    """Each run of the engine's own writer, its cost put here as it ends (the writer itself runs unchanged)."""
    writer, ended = engine.turns.glosses, queue.Queue()
    write = writer.write

    def observed(model, memory) -> GlossCost:
        cost = write(model, memory)
        ended.put(cost)
        return cost

    writer.write = observed
    BOOK.clear()
    yield ended
    writer.write = write
    engine.wait_idle()
    BOOK.clear()


def _status_block(engine: Engine, conversation_id: str):
    return next(b for b in engine.lifecycle.get(conversation_id).memory.table.blocks if "STATUS_REFRESH_MS" in b.text)


def _until_glossed(engine: Engine, runs: queue.Queue, conversation_id: str) -> list[GlossCost]:
    seen = [runs.get(timeout=WAIT_S)]
    while not BOOK.written(_status_block(engine, conversation_id).hash):
        seen.append(runs.get(timeout=WAIT_S))
    return seen


def test_a_turns_end_has_the_model_gloss_its_value_lines_on_idle_time(engine, runs):
    writer = engine.turns.glosses
    before = GlossCost(**vars(writer.total))
    conv = engine.new_conversation()
    first = conv.submit("Here is the timing file.", [("status.ts", CODE)], max_tokens=8, temperature=0).result()
    seen = _until_glossed(engine, runs, conv.id)
    done = sum(c.blocks for c in seen)
    assert done >= 1 and 0 < sum(c.reply_tokens for c in seen) <= done * GLOSS_TOKENS_PER_BLOCK
    assert writer.total.runs - before.runs >= len(seen) and writer.total.model_s > before.model_s
    assert writer.total.wall_s - before.wall_s >= writer.total.model_s - before.model_s
    again = conv.submit("Thanks.", max_tokens=8, temperature=0).result()   # the scratch sequence is free again
    after = runs.get(timeout=WAIT_S)                                       # that turn's end: each block once
    assert first.n_tokens > 0 and again.n_tokens > 0 and after.blocks == 0 and after.prompt_tokens == 0
    conv.check()


def test_the_gloss_prompt_is_decoded_a_prefill_step_at_a_time_the_stop_flag_read_before_each(engine, runs):
    writer = engine.turns.glosses
    generate = writer.generate
    done: list = []
    reads = [0]

    def counted(model, tokens, params, on_token, cancel, **held):
        class Count:
            def is_set(self) -> bool:
                reads[0] += 1
                return cancel.is_set()
        done.append(generate(model, tokens, params, on_token, Count(), **held))
        return done[-1]

    writer.generate = counted
    try:
        conv = engine.new_conversation()
        conv.submit("Here is the timing file.", [("status.ts", CODE)], max_tokens=8, temperature=0).result()
        _until_glossed(engine, runs, conv.id)
    finally:
        writer.generate = generate
    chunk = engine.settings.prefill_step_tokens
    prompt_chunks = sum(-(-c.prompt_tokens // chunk) for c in done)
    assert done and all(c.prompt_tokens > chunk for c in done)         # a prompt longer than one step
    assert reads[0] >= prompt_chunks + sum(c.n_tokens for c in done)   # read before each chunk and each token
    conv.check()


def test_a_turn_that_arrives_while_a_gloss_decodes_starts_after_at_most_one_more_decode(engine, runs):
    writer = engine.turns.glosses
    generate = writer.generate
    decoding, queued = threading.Event(), threading.Event()
    decodes_after: list[int] = []

    def watched(model, tokens, params, on_token, cancel, **held):
        class Watch:                     # the engine's own stop flag, read before each decode of the writer's
            def is_set(self) -> bool:
                busy = cancel.is_set()
                if queued.is_set() and not busy:
                    decodes_after.append(1)     # a decode begun after the turn was submitted
                decoding.set()
                return busy
        return generate(model, tokens, params, on_token, Watch(), **held)

    writer.generate = watched
    try:
        conv = engine.new_conversation()
        conv.submit("Here is the timing file.", [("status.ts", CODE)], max_tokens=8, temperature=0).result()
        assert decoding.wait(WAIT_S)
        queued.set()
        turn = conv.submit("Thanks.", max_tokens=8, temperature=0)
        cut = runs.get(timeout=WAIT_S)
        assert turn.result(WAIT_S).n_tokens > 0
        assert cut.interrupted == 1 and len(decodes_after) <= 1          # the one already checked, at most
        seen = _until_glossed(engine, runs, conv.id)                      # the next idle time writes it
        assert not cut.prompt_tokens or sum(c.resumed for c in seen) == 1   # on from what the cut run decoded
    finally:
        writer.generate = generate
    conv.check()


class _CutAfter:
    """A stop flag that trips at its `n`-th read (the reads come before each prompt chunk and each reply token)."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    def is_set(self) -> bool:
        self.reads += 1
        return self.reads >= self.n


@pytest.mark.parametrize("cut_at", [2, 9])              # in the prompt's second chunk; in the reply
def test_a_completion_cut_short_goes_on_from_its_held_cells(engine, cut_at):
    """What a cut gloss decoded is held in RAM and put back at the next idle time: the same cells (llama.cpp's
    state of the sequence, byte for byte), the prompt not decoded again (only the last held token, for its logits),
    the reply going on from the held one. (Not compared with an uncut reply token for token: the cells put back
    can sit at other cells than they were decoded at, and a 135M model's near-tie then flips.)"""
    from evoke_engine.conversations.completion import complete
    from evoke_engine.conversations.gloss_writer import GREEDY

    model = engine.model
    scratch = model.rt.scratch_seq
    tokens = engine.tokenize("Count from 1 to 60, separated by commas: " + ", ".join(map(str, range(1, 31))) + ",",
                             special=False)
    chunk = 16

    def run(cancel, **held):
        return engine.thread.call(complete, model, tokens, GREEDY, None, cancel, seq=scratch, prefill_chunk=chunk,
                                  **held)

    held: list = []
    cut = run(_CutAfter(cut_at), hold=held.append)
    assert cut.stopped == "cancelled" and len(held) == 1 and engine.thread.call(model.kv.pos_max, scratch) == -1
    decoded = len(held[0].tokens)
    assert decoded == (chunk if cut_at == 2 else len(tokens) + cut_at - 1 - -(-len(tokens) // chunk))
    assert cut.prompt_decoded == min(decoded, len(tokens))

    def round_trip() -> bytes:
        assert model.kv.put_back_cells(scratch, held[0].cells) and model.kv.pos_max(scratch) == decoded - 1
        again = model.kv.hold_cells(scratch)
        model.kv.drop(scratch)
        return again
    assert engine.thread.call(round_trip) == held[0].cells

    resumed = run(threading.Event(), resume=held[0])
    held_reply = model.rt.detokenize(list(held[0].tokens[len(tokens):]))
    assert resumed.prompt_decoded == max(0, len(tokens) - decoded + 1)       # only what was not held, and the last
    assert resumed.text.startswith(held_reply) and resumed.n_tokens > decoded - len(tokens)
    assert resumed.stopped in ("eos", "max_tokens") and engine.thread.call(model.kv.pos_max, scratch) == -1
