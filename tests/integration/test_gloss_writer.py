"""The gloss writer on the real embedded model (issue 61): glosses written on the engine thread's idle time through
llama.cpp (the scratch sequence, the sampler), within the per-block cap, the conversation's turns unharmed after;
a turn submitted while a gloss is written stops it before its next decode, and the turn then runs. The writer is
queued here as the engine's hook would queue it (a BACKGROUND job; `TurnJobs(glosses=...)` is not wired in the
engine yet)."""

from __future__ import annotations

import threading

import pytest

from evoke_engine import Engine, Settings
from evoke_engine.conversations.completion import complete
from evoke_engine.conversations.gloss_writer import GlossWriter
from evoke_engine.memory.glosses import BOOK, GLOSS_TOKENS_PER_BLOCK
from evoke_engine.worker import BACKGROUND, Command

pytestmark = pytest.mark.slow
CODE = ("// timings of the dashboard and its polling loop\nexport const STATUS_REFRESH_MS = 4500;\n"
        '"autosaveDelayMs": 900,\nexport const MAX_TOAST_STACK = 4;\n')


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("glosses")), budget_tokens=1024, n_ctx=4096,
                        embedder="off", recall_glosses="on")
    with Engine(settings, prewarm=False) as eng:
        yield eng


@pytest.fixture(autouse=True)
def empty_book():
    BOOK.clear()
    yield
    BOOK.clear()


def _writer(engine: Engine, generate=complete) -> GlossWriter:
    return GlossWriter(lambda: engine.thread.pending() > 0 or bool(engine.thread.streaming()), generate=generate)


def _write(engine: Engine, writer: GlossWriter, conversation_id: str):
    state = engine.lifecycle.get(conversation_id)
    return engine.thread.submit(lambda: writer.write(engine.lifecycle.model, state.memory), priority=BACKGROUND,
                                command=Command.EMBED)


def test_the_model_glosses_a_files_value_lines_on_idle_time(engine):
    conv = engine.new_conversation()
    first = conv.submit("Here is the timing file.", [("status.ts", CODE)], max_tokens=8, temperature=0).result()
    writer = _writer(engine)
    cost = _write(engine, writer, conv.id).result(120)
    memory = engine.lifecycle.get(conv.id).memory
    block = next(b for b in memory.table.blocks if "STATUS_REFRESH_MS" in b.text)
    assert BOOK.written(block.hash) and cost.blocks >= 1 and cost.interrupted == 0
    assert 0 < cost.reply_tokens <= cost.blocks * GLOSS_TOKENS_PER_BLOCK and cost.prompt_tokens > 0
    assert cost.lines >= 2 and cost.glossed_lines <= cost.lines
    assert _write(engine, writer, conv.id).result(120).blocks == 0           # each block once
    again = conv.submit("Thanks.", max_tokens=8, temperature=0).result()   # the scratch sequence is free again
    assert first.n_tokens > 0 and again.n_tokens > 0
    conv.check()


def test_a_turn_submitted_while_a_gloss_is_written_stops_it_before_its_next_decode(engine):
    conv = engine.new_conversation()
    conv.submit("Here is the timing file.", [("status.ts", CODE)], max_tokens=8, temperature=0).result()
    writing, queued = threading.Event(), threading.Event()
    decodes_after: list[int] = []

    def generate(model, tokens, params, on_token, cancel):
        class Watch:                         # counts the decodes the writer starts once the turn is queued
            def is_set(self) -> bool:
                busy = cancel.is_set()
                if queued.is_set() and not busy:
                    decodes_after.append(1)
                writing.set()
                return busy
        return complete(model, tokens, params, on_token, Watch())

    job = _write(engine, _writer(engine, generate), conv.id)
    assert writing.wait(60)
    queued.set()
    turn = conv.submit("Thanks.", max_tokens=8, temperature=0)
    cost = job.result(120)
    assert turn.result(120).n_tokens > 0
    assert cost.interrupted == 1 and len(decodes_after) <= 1                # the one already checked, at most
    block = next(b for b in engine.lifecycle.get(conv.id).memory.table.blocks if "STATUS_REFRESH_MS" in b.text)
    assert not BOOK.written(block.hash)                                    # nothing kept of a reply cut short
    conv.check()
