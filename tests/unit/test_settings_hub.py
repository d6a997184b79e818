"""Settings apply now by subscription (issue 25): the hub's contract, then what each consumer DOES after a
change: the memory evicts to a new budget and scores with new weights, the pool spills past a new RAM budget,
the KV files expire by new TTLs, sampling built afterwards uses new values while a snapshot keeps the old ones,
and `focus` is written on the engine thread. Plain objects and the fake KV cache: no model."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from helpers.clock import FakeClock

from evoke_engine.conversations.lifecycle import ConversationLifecycle, ConversationState
from evoke_engine.conversations.loaded_model import follow_pool_settings, follow_ttl_settings
from evoke_engine.engine import Engine
from evoke_engine.kvcache.blocks import BlockState
from evoke_engine.runtime.sampling import SamplingParams
from evoke_engine.settings import Settings
from evoke_engine.settings_hub import SettingsHub
from evoke_engine.store.history import HistoryDB
from evoke_engine.store.kvfiles import KVFileStore

pytestmark = pytest.mark.unit


def _fill(rig, memory, n_blocks, n=16):
    return [rig.add(memory, "file", n, priority=0.5) for _ in range(n_blocks)]


# -- the hub ---------------------------------------------------------------------------------------------
def test_settings_are_frozen_and_a_change_is_a_new_value(tmp_path):
    settings = Settings(home=str(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.budget_tokens = 100                                      # type: ignore[misc]
    adopted = settings.with_now_of(settings.replace(budget_tokens=999, n_ctx=1024))
    assert (adopted.budget_tokens, adopted.n_ctx) == (999, settings.n_ctx)   # n_ctx waits for a reload
    assert adopted.changed(settings) == ["budget_tokens"] and settings.budget_tokens != 999


def test_a_subscriber_hears_only_changes_of_its_fields_with_old_and_new(tmp_path):
    hub = SettingsHub(Settings(home=str(tmp_path)))
    heard: list[tuple[str, object, object]] = []
    hub.subscribe(lambda old, new: heard.append(("budget", old.budget_tokens, new.budget_tokens)),
                  fields=("budget_tokens",))
    hub.subscribe(lambda old, new: heard.append(("any", old.temperature, new.temperature)))
    first = hub.current
    assert hub.apply(first.replace(temperature=0.2)) == ["temperature"]
    assert heard == [("any", 0.7, 0.2)]
    heard.clear()
    assert hub.apply(hub.current.replace()) == [] and heard == []          # no change: nobody is called
    hub.apply(hub.current.replace(budget_tokens=4096))
    assert heard == [("budget", 2048, 4096), ("any", 0.2, 0.2)]
    assert hub.current.budget_tokens == 4096 and first.budget_tokens == 2048   # the old value is untouched
    with pytest.raises(ValueError, match="no such settings: budget"):
        hub.subscribe(lambda old, new: None, fields=("budget",))


def test_a_failing_subscriber_does_not_keep_the_others_stale_and_a_cancelled_one_hears_nothing(tmp_path):
    hub = SettingsHub(Settings(home=str(tmp_path)))
    heard: list[int] = []

    def fail(old, new):
        raise RuntimeError("consumer broke")
    hub.subscribe(fail, fields=("top_k",))
    receipt = hub.subscribe(lambda old, new: heard.append(new.top_k), fields=("top_k",))
    with pytest.raises(RuntimeError, match="consumer broke"):
        hub.apply(hub.current.replace(top_k=5))
    assert heard == [5] and hub.current.top_k == 5
    receipt.cancel()
    receipt.cancel()                                                     # a second cancel is harmless
    with pytest.raises(RuntimeError):
        hub.apply(hub.current.replace(top_k=6))
    assert heard == [5] and hub.subscribers("top_k") == 1


# -- the memory of open conversations ------------------------------------------------------------------
def test_a_smaller_budget_evicts_the_open_conversations_through_the_lifecycle(rig, tmp_path):
    hub = SettingsHub(rig.settings)
    history = HistoryDB(tmp_path / "history.sqlite3")
    lifecycle = ConversationLifecycle(history, emit=rig.events.append, clock=FakeClock(), ensure_model=lambda: None)
    hub.subscribe(lifecycle.adopt_settings)                              # as the Engine wires it
    memory = rig.memory()
    lifecycle._states["c"] = ConversationState(id="c", title="t", system_prompt="", tools=[], memory=memory)
    blocks = _fill(rig, memory, 10)                                      # 176 tokens: under 184, nothing left
    assert memory.counters.evictions == 0
    hub.apply(hub.current.replace(budget_tokens=120))
    assert memory.budget_tokens == 120 and memory.active_tokens <= int(120 * 0.70)
    assert [b.state for b in blocks[:4]] == [BlockState.RAM] * 4          # the oldest of equal scores left
    memory.check()
    assert rig.kv.layout(memory.seq) == rig.expected_layout(memory)
    assert lifecycle.latest_stats("c").budget_tokens == 120               # the window's snapshot says so
    rig.add(memory, "file", 16)
    memory.end_turn()
    assert memory.active_tokens <= 120
    history.close()


def test_a_lower_high_watermark_evicts_at_the_next_turn_end(rig):
    hub = SettingsHub(rig.settings)
    memory = rig.memory()
    hub.subscribe(memory.adopt_settings)
    _fill(rig, memory, 10)
    memory.end_turn()
    assert memory.counters.evictions == 0                                # 176 <= 184
    hub.apply(hub.current.replace(high_watermark=0.8))                   # 176 > 160: evicts, but not yet
    assert memory.counters.evictions == 0
    memory.end_turn()
    assert memory.counters.evictions > 0 and memory.active_tokens <= int(200 * 0.70)


def test_new_scorer_weights_and_floors_change_the_scores_of_the_next_decision(rig):
    hub = SettingsHub(rig.settings)
    memory = rig.memory()
    hub.subscribe(memory.adopt_settings)
    user = rig.block("user", 16, turn=1)
    before = memory.scorer.score(user, query=None, focus=None, current_turn=20)
    hub.apply(hub.current.replace(user_floor=0.9, focus_ema=0.6))
    assert before == pytest.approx(0.6)                                 # the old floor (recency has faded)
    assert memory.scorer.score(user, query=None, focus=None, current_turn=20) == pytest.approx(0.9)
    assert memory.focus.ema == 0.6


# -- engine-wide consumers ---------------------------------------------------------------------------
def test_a_smaller_ram_budget_spills_the_saved_blocks_to_disk_at_once(rig):
    hub = SettingsHub(rig.settings)
    follow_pool_settings(hub, rig.pool)
    memory = rig.memory()
    blocks = _fill(rig, memory, 11)                                      # 192 > 184: four blocks saved
    saved = [b for b in blocks if b.state is BlockState.RAM]
    assert saved and rig.pool.ram_bytes > 0
    hub.apply(hub.current.replace(ram_budget_bytes=0))
    assert rig.pool.ram_bytes == 0 and all(b.state is BlockState.DISK for b in saved)


def test_a_shorter_ttl_expires_the_kv_files_by_it(tmp_path):
    clock = FakeClock()
    hub = SettingsHub(Settings(home=str(tmp_path)))
    store = KVFileStore(tmp_path / "cache", "0123456789abcdef", hub.current.ttl_seconds(), clock=clock)
    current: list[KVFileStore | None] = [None]
    follow_ttl_settings(hub, lambda: current[0])
    hub.apply(hub.current.replace(ttl_short_s=60))                       # no files yet: nothing to tell
    current[0] = store
    store.write("c", "long", b"kv" * 64)
    clock.advance(200)
    assert store.has("c")                                                # 200 s < the long TTL of an hour
    hub.apply(hub.current.replace(ttl_long_s=100))
    assert not store.has("c")                                            # expired by the TTL applied now
    assert store.ttl_seconds == {"short": 60, "long": 100, "extended": 86400}


def test_sampling_built_after_a_change_uses_it_and_a_snapshot_keeps_its_values(tmp_path):
    hub = SettingsHub(Settings(home=str(tmp_path)))
    snapshot = hub.current                                              # what a queued turn was built from
    hub.apply(hub.current.replace(temperature=0.1, top_k=3, max_tokens=77))
    assert SamplingParams.from_settings(hub.current) == SamplingParams.from_settings(
        snapshot, temperature=0.1, top_k=3, max_tokens=77)
    assert SamplingParams.from_settings(snapshot).temperature == 0.7


def test_sampling_read_from_another_thread_never_sees_half_a_change(tmp_path):
    hub = SettingsHub(Settings(home=str(tmp_path)))
    pairs = [(0.1, 1), (0.9, 9)]
    values = [hub.current.replace(temperature=t, top_k=k) for t, k in pairs]
    stop, torn = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            params = SamplingParams.from_settings(hub.current)
            if (params.temperature, params.top_k) not in pairs + [(0.7, 40)]:
                torn.append(params)
    reader = threading.Thread(target=read)
    reader.start()
    for i in range(3000):
        hub.apply(values[i % 2])
    stop.set()
    reader.join()
    assert torn == []


# -- who writes the engine's focus ----------------------------------------------------------------------
def test_focus_is_written_on_the_engine_thread_in_queue_order(tmp_path):
    settings = Settings(home=str(tmp_path), model_path=str(tmp_path / "missing.gguf"))
    engine = Engine(settings, wait=False, scheduler=False, prewarm=False)   # the load fails: no model
    try:
        busy, release = threading.Event(), threading.Event()
        engine.thread.submit(lambda: (busy.set(), release.wait(10)))
        assert busy.wait(10)
        done = engine.focus("c")
        assert engine.focused is None and not done.done()                 # queued behind the running job
        release.set()
        done.result(timeout=10)
        assert engine.focused == "c"
    finally:
        release.set()
        engine.close()
