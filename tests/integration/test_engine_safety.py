"""Issue 14 on the real embedded model: public calls wait for the engine thread, each turn has its own
cancel, a lost spill file falls back to a rebuild, and every "applies now" setting reaches its user."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from helpers.clock import FakeClock

from evoke_engine import Engine, Settings
from evoke_engine.settings import NOW

BRIEF = {"system_prompt": "You are brief.", "tools": []}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("safety")), budget_tokens=384, n_ctx=4096, slots=2)
    with Engine(settings, scheduler=False, prewarm=False) as eng:
        yield eng


class Gate:
    """Holds the engine thread busy until opened, so what queues behind it can be observed."""

    def __init__(self, engine: Engine) -> None:
        self.started, self.opened = threading.Event(), threading.Event()
        self.done = engine.thread.submit(self._hold, priority=0)
        assert self.started.wait(60)

    def _hold(self) -> None:
        self.started.set()
        self.opened.wait(120)

    def open(self) -> None:
        self.opened.set()
        self.done.result()


def wait_until(predicate, seconds: float = 30) -> None:
    """Poll until `predicate` holds; the deadline only keeps a broken run from hanging."""
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("call", ["rename", "pin"])
def test_rename_and_pin_wait_for_the_engine_thread(engine, call):
    conv = engine.new_conversation(**BRIEF)
    gate = Gate(engine)
    worker = threading.Thread(target=(lambda: engine.rename_conversation(conv.id, "Renamed")) if call == "rename"
                              else (lambda: engine.pin_conversation(conv.id, True)))
    worker.start()
    wait_until(lambda: not worker.is_alive() or engine.thread.pending() > 0)
    finished_while_engine_busy = not worker.is_alive()
    gate.open()
    worker.join(60)
    assert not finished_while_engine_busy, f"{call} touched engine-thread state off the engine thread"
    info = next(i for i in engine.conversations() if i.id == conv.id)
    assert (info.title == "Renamed") if call == "rename" else info.pinned


def test_a_second_submit_does_not_clear_the_first_turns_cancel(engine):
    conv = engine.new_conversation(**BRIEF)
    gate = Gate(engine)
    first = conv.submit("Write a long story about a dragon.", max_tokens=40, temperature=0)
    conv.cancel()                                    # the first turn is queued: it must stay cancelled
    second = conv.submit("Say hello.", max_tokens=4, temperature=0)
    gate.open()
    assert first.result().stopped == "cancelled"
    assert second.result().stopped != "cancelled"
    conv.check()


def test_a_lost_spill_file_falls_back_to_a_rebuild(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=1, ram_budget_bytes=0)
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        events: list[str] = []
        engine.subscribe(lambda e: events.append(e.kind))
        first = engine.new_conversation(**BRIEF)
        first.send("Remember the word lantern.", max_tokens=6, temperature=0)
        engine.new_conversation(**BRIEF)            # one slot: the first is parked, its image spills to disk
        assert first.stats().memory == "disk"
        spilled = list(engine.diagnostics().pool.spill_dir.glob("*.kv"))
        assert spilled
        for path in spilled:
            path.unlink()
        first.send("Which word did I ask you to remember?", max_tokens=6, temperature=0)
        assert "kv_rebuilt" in events
        first.check()
        assert [m["role"] for m in first.messages()] == ["user", "assistant", "user", "assistant"]


def test_file_ttl_expiry_uses_the_ttls_applied_now(tmp_path):
    clock = FakeClock()
    with Engine(Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2), clock=clock,
                scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(**BRIEF)
        conv.send("Hello.", max_tokens=4, temperature=0)
        engine.release_conversation(conv.id)
        assert engine.kvfiles.has(conv.id)
        engine.apply_settings(engine.settings.replace(ttl_long_s=100))
        clock.now += 200
        assert not engine.kvfiles.has(conv.id)


# A new value for each "applies now" setting, valid together with the others' defaults.
NEW_VALUES = {
    "budget_tokens": 640, "high_watermark": 0.9, "low_watermark": 0.6, "tail_fraction": 0.2, "block_tokens": 96,
    "recovery": "breadcrumb", "recovery_top_k": 2, "recovery_margin": 0.03, "recovery_overdraft_tokens": 128,
    "recovery_keep_used": False, "recovery_width_tokens": 2048, "recovery_file_neighbours": True,
    "recovery_questions_last": False, "recovery_signal_tops": 3,
    "recall_file_name_line": False, "recall_skip_questions": True, "recall_line_context": True,
    "recall_value_lines": False, "recall_glosses": "on",
    "chunk_reuse": False, "chunk_reuse_across_owners": True, "chunk_reuse_approximate": True,
    "chunk_reuse_repair_tokens": 8,
    "recall_signal": "lines+lexical", "recall_user_margin": 0.2, "ram_budget_bytes": 1 << 20, "embedder": "off",
    "pool_bits": 8, "kv_file_bits": 8, "parallel_replies": 2, "prefill_step_tokens": 64,
    "weight_similarity": 2.0, "weight_focus": 0.25, "weight_recency": 0.75, "recency_half_life_turns": 6.0,
    "focus_ema": 0.45, "focus_snap_cosine": 0.1, "user_floor": 0.4, "assistant_floor": 0.3,
    "weight_attention": 0.5, "attention_aggregation": "mean",
    "system_prompt": "You are terse.", "tools_enabled": False, "temperature": 0.3, "top_p": 0.8, "top_k": 20,
    "min_p": 0.1, "repeat_penalty": 1.2, "max_tokens": 77, "seed": 7, "ttl_short_s": 111, "ttl_long_s": 222,
    "ttl_extended_s": 333, "disk_budget_bytes": 1 << 25, "keepalive_interval_s": 77, "eviction_interval_s": 88,
    "model_idle_unload_s": 99, "server_enabled": True, "server_host": "localhost", "server_port": 8799,
    "api_key": "k-123", "server_max_request_bytes": 1 << 20, "theme": "light", "text_size": 125,
}


def test_every_applies_now_setting_applies_without_a_reload_and_the_conversation_goes_on(tmp_path):
    """Each consumer's behaviour after a change is unit-tested (tests/unit/test_settings_hub.py); here the real
    engine takes every "applies now" setting without a reload, its consumers hold the new values, and an open
    conversation still answers and mirrors llama.cpp afterwards."""
    now_fields = [f.name for f in dataclasses.fields(Settings) if f.metadata.get("applies") == NOW]
    assert sorted(NEW_VALUES) == sorted(now_fields), "give each new 'applies now' setting a value here"
    with Engine(Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2), prewarm=False) as engine:
        conv = engine.new_conversation(**BRIEF)
        conv.send("Hello.", max_tokens=4, temperature=0)
        for name in now_fields:
            new = NEW_VALUES[name]
            assert getattr(engine.settings, name) != new, name
            assert engine.apply_settings(engine.settings.replace(**{name: new})) == []
            assert getattr(engine.settings, name) == new
        assert conv.stats().budget_tokens == NEW_VALUES["budget_tokens"]
        pool = engine.diagnostics().pool
        assert pool.ram_budget_bytes == NEW_VALUES["ram_budget_bytes"] and pool.bits == 8
        assert engine.kvfiles.ttl_seconds == {"short": 111, "long": 222, "extended": 333}
        assert engine.settings.kv_file_bits == 8                    # read by the next persist (lifecycle.persist)
        assert not engine.diagnostics().embedder.enabled
        assert engine.diagnostics().rt.step_tokens() in (0, 64)     # read at each decode: 64 while others wait
        jobs = {job["id"]: job["interval_s"] for job in engine.sweeps.jobs()}
        assert jobs["keepalive"] == 77 and jobs["eviction"] == 88
        conv.send("And again.", max_tokens=4)
        conv.check()


def test_benches_read_history_and_blocks_through_public_calls(engine):
    conv = engine.new_conversation(**BRIEF)
    conv.send("Read this.", [("note.txt", "The passkey is 4242.")], max_tokens=4, temperature=0)
    history = conv.template_history()
    assert [m["role"] for m in history] == ["user", "assistant"]
    history.clear()                                                 # a copy: the engine's is untouched
    assert len(conv.template_history()) == 2
    blocks = conv.blocks(with_text=True)
    assert any(b["role"] == "file" and "4242" in b["text"] and b["state"] == "resident" for b in blocks)
    assert [{k: v for k, v in b.items() if k != "text"} for b in blocks] == list(conv.stats().blocks)
    assert "text" not in conv.blocks()[0]
