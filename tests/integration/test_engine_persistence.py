"""Slots, persistence across restarts, crash safety, damaged files, TTLs, sweeps and model unload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.clock import FakeClock

from evoke_engine import Engine, Settings

ROOT = Path(__file__).resolve().parents[2]
CHILD = [sys.executable, str(ROOT / "tests" / "helpers" / "persist_child.py")]
DOC = "\n".join(f"Entry {i}: the cache at node {i} holds {i * 3} pages." for i in range(24))


def child(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*CHILD, *args], capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def script(conv_names: list[str], engine: Engine) -> list[str]:
    """Three conversations, two turns each, interleaved: A1 B1 C1 A2 B2 C2."""
    convs = {name: engine.new_conversation(system_prompt="You are brief.", tools=[]) for name in conv_names}
    replies = []
    for turn in ("Read this.", "What does node 5 hold?"):
        for name in conv_names:
            attachments = [(f"{name}.txt", DOC.replace("pages", f"{name}-pages"))] if turn == "Read this." else []
            replies.append(convs[name].send(turn, attachments, max_tokens=12, temperature=0))
            convs[name].check()
    return replies


def test_more_conversations_than_slots_gives_identical_replies(tmp_path):
    events: list[str] = []
    with Engine(Settings(home=str(tmp_path / "a"), slots=4, budget_tokens=1024, n_ctx=4096),
                scheduler=False, prewarm=False) as roomy:
        reference = script(["A", "B", "C"], roomy)
    with Engine(Settings(home=str(tmp_path / "b"), slots=2, budget_tokens=1024, n_ctx=4096),
                scheduler=False, prewarm=False) as tight:
        tight.subscribe(lambda e: events.append(e.kind))
        replies = script(["A", "B", "C"], tight)
        infos = {info.memory for info in tight.conversations()}
    assert events.count("parked") >= 3                     # LRU conversations left their slot...
    assert replies == reference                            # ...and came back without any difference
    assert "slot" in infos


def _held_ahead(engine: Engine, conversation_id: str) -> int:
    """Tokens held ahead at the end of the conversation's slot (it is brought into one first)."""
    def in_slot() -> int:
        state = engine.lifecycle.open(conversation_id)
        engine.lifecycle.ensure_slot(state)
        return engine.diagnostics().kv.ahead_tokens(state.memory.seq)
    return engine.thread.call(in_slot)


def test_the_next_message_opening_is_held_ahead_through_park_and_restart(tmp_path):
    """A reply's closing decodes the next user message's opening too; the next turn skips it, and it
    survives leaving the slot and a restart (it is the image's last cells)."""
    settings = Settings(home=str(tmp_path), slots=1, budget_tokens=1024, n_ctx=4096)
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Read this.", [("a.txt", DOC)], max_tokens=8, temperature=0)
        assert _held_ahead(engine, conv.id) == 3                     # <|im_start|> user \n
        claimed = engine.diagnostics().kv.ahead_claimed
        conv.send("What does node 5 hold?", max_tokens=8, temperature=0)
        assert engine.diagnostics().kv.ahead_claimed == claimed + 3
        other = engine.new_conversation(system_prompt="You are brief.", tools=[])   # parks conv
        other.send("Hello.", max_tokens=4, temperature=0)
        assert _held_ahead(engine, conv.id) == 3                     # back in the one slot, still held
        conv.check()
        cid = conv.id
        branch = conv.fork(len(conv.messages()) - 1)                # the same history, no restart
        expected = branch.send("And node 7?", max_tokens=12, temperature=0)
        engine.delete_conversation(branch.id)
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        conv = engine.open_conversation(cid)
        assert _held_ahead(engine, cid) == 3
        conv.check()
        assert conv.send("And node 7?", max_tokens=12, temperature=0) == expected


def test_a_new_conversation_holds_its_first_opening_as_decoding_it_would(tmp_path):
    """The prefix's first-user opening is spliced into a new conversation, held ahead: its K/V bytes
    are those a decode in the conversation gives (same cells before it, same positions), and the
    first message claims it instead of decoding it."""
    with Engine(Settings(home=str(tmp_path), slots=2, budget_tokens=1024, n_ctx=4096), scheduler=False,
                prewarm=False) as engine:
        held = engine.new_conversation(system_prompt="You are brief.", tools=[])
        plain = engine.new_conversation(system_prompt="You are brief.", tools=[])

        def compare() -> tuple[list[int], bytes, bytes]:
            a, b = engine.lifecycle.open(held.id), engine.lifecycle.open(plain.id)
            opening, at = a.prefix.opening, a.memory.active_tokens
            assert engine.diagnostics().kv.held_ahead(a.memory.seq) == opening
            engine.diagnostics().kv.drop(b.memory.seq, at, -1)                     # b decodes the opening itself
            engine.diagnostics().rt.decode(opening, b.memory.seq, at, logits_last=False)
            ours = engine.diagnostics().kv.save(a.memory.seq, at, at + len(opening)).data
            theirs = engine.diagnostics().kv.save(b.memory.seq, at, at + len(opening)).data
            engine.diagnostics().kv.drop(b.memory.seq, at, -1)
            return opening, bytes(ours), bytes(theirs)

        opening, ours, theirs = engine.thread.call(compare)
        assert len(opening) == 3 and ours == theirs                  # <|im_start|> user \n, bit for bit
        claimed = engine.diagnostics().kv.ahead_claimed
        held.send("What does node 5 hold?", max_tokens=4, temperature=0)
        assert engine.diagnostics().kv.ahead_claimed == claimed + 3
        held.check()


@pytest.mark.slow
def test_reply_after_a_restart_equals_the_reply_without_it(tmp_path):
    kept = child("build", str(tmp_path / "kept"), "ask")
    persisted = child("build", str(tmp_path / "restarted"), "no")
    reopened = child("reopen", str(tmp_path / "restarted"), persisted["id"])
    assert "kv_restored" in reopened["events"] and "kv_rebuilt" not in reopened["events"]
    assert reopened["active"] > 0
    assert reopened["prefill_after_open"] == persisted["prefill"]      # the open itself prefilled nothing
    assert reopened["reply"] == kept["reply"]


@pytest.mark.slow
def test_damaged_cache_file_is_rebuilt_from_history(tmp_path):
    home = str(tmp_path / "home")
    built = child("build", home, "no")
    files = list((tmp_path / "home" / "cache" / "kv").rglob("*.bin"))
    assert len(files) == 1
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF                                # flip a byte inside the payload
    files[0].write_bytes(bytes(data))
    reopened = child("reopen", home, built["id"])
    assert "kv_rebuilt" in reopened["events"]
    assert reopened["reply"]


def test_payload_that_is_not_a_snapshot_is_rejected_cleanly(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2)
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Read this.", [("d.txt", DOC)], max_tokens=8, temperature=0)
        engine.release_conversation(conv.id)
        for garbage in (b"", b"\x00" * 3, b"\xff\xff\xff\x7f{}", b"\x02\x00\x00\x00{}",
                        b'\x0d\x00\x00\x00{"format":99}'):
            engine.kvfiles.write(conv.id, "long", garbage)
            events: list[str] = []
            engine.subscribe(lambda e, sink=events: sink.append(e.kind))
            reopened = engine.open_conversation(conv.id)
            reopened.check()
            assert "kv_rebuilt" in events
            assert reopened.stats().active_tokens > 0
            engine.release_conversation(conv.id)


@pytest.mark.slow
def test_writer_killed_mid_persist_never_leaves_a_corrupt_file(tmp_path):
    home = str(tmp_path / "home")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*CHILD, "hammer", home], stdout=subprocess.PIPE, text=True, env=env)
    conversation_id = json.loads(proc.stdout.readline())["id"]
    time.sleep(1.5)                                            # several persists are under way by now
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reopened = child("reopen", home, conversation_id)
    assert reopened["reply"]
    assert set(reopened["events"]) & {"kv_restored", "kv_rebuilt"}


def test_ttl_expiry_idle_release_and_pinned_extended(tmp_path):
    clock = FakeClock()
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2, ttl_long_s=3600,
                        ttl_extended_s=86400)
    with Engine(settings, clock=clock, scheduler=False, prewarm=False) as engine:
        from evoke_engine.sweeps import Sweeps

        sweeps = Sweeps(engine, scheduler=_ManualScheduler())
        plain = engine.new_conversation(system_prompt="You are brief.", tools=[])
        pinned = engine.new_conversation(system_prompt="You are brief.", tools=[])
        for conv in (plain, pinned):
            conv.send("Hello there.", max_tokens=8, temperature=0)
        engine.pin_conversation(pinned.id, True)

        clock.now += 3000
        assert engine.thread.call(sweeps.eviction_sweep) == []          # not idle long enough yet
        clock.now += 700
        released = engine.thread.call(sweeps.eviction_sweep)
        assert released == [plain.id]                                    # pinned: extended TTL
        assert engine.kvfiles.has(plain.id)
        names = {p.name for p in (tmp_path / "cache" / "kv").rglob("*.bin")}
        assert any(n.endswith(".long.bin") for n in names)

        clock.now += 3700                                                # the long file expires
        engine.thread.call(sweeps.eviction_sweep)
        assert not engine.kvfiles.has(plain.id)
        reopened = engine.open_conversation(plain.id)                     # SQLite still has it
        assert reopened.messages()[0]["text"] == "Hello there."

        clock.now += 90000                                               # pinned idle past 24 h
        assert pinned.id in engine.thread.call(sweeps.eviction_sweep)
        assert any(p.name.endswith(".extended.bin") for p in (tmp_path / "cache" / "kv").rglob("*.bin"))


def test_disk_budget_sweep_deletes_least_recently_used_files(tmp_path):
    clock = FakeClock()
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2)
    with Engine(settings, clock=clock, scheduler=False, prewarm=False) as engine:
        from evoke_engine.sweeps import Sweeps

        sweeps = Sweeps(engine, scheduler=_ManualScheduler())
        convs = [engine.new_conversation(system_prompt="You are brief.", tools=[]) for _ in range(3)]
        for i, conv in enumerate(convs):
            conv.send(f"Note {i}: remember it.", max_tokens=6, temperature=0)
            engine.release_conversation(conv.id)
            clock.now += 10                                          # files written 10 s apart
        size = engine.kvfiles.total_bytes()
        assert engine.thread.call(sweeps.eviction_sweep) == [] and engine.kvfiles.total_bytes() == size
        engine.apply_settings(engine.settings.replace(disk_budget_bytes=int(size * 0.7)))
        engine.thread.call(sweeps.eviction_sweep)                       # the sweep enforces the budget
        assert engine.kvfiles.total_bytes() <= int(size * 0.7)
        assert not engine.kvfiles.has(convs[0].id)
        assert engine.kvfiles.has(convs[2].id)


def test_model_unloads_when_idle_and_comes_back_on_the_next_message(tmp_path):
    clock = FakeClock()
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2, model_idle_unload_s=60)
    with Engine(settings, clock=clock, scheduler=False, prewarm=False) as engine:
        from evoke_engine.sweeps import Sweeps

        sweeps = Sweeps(engine, scheduler=_ManualScheduler())
        events: list[str] = []
        engine.subscribe(lambda e: events.append(e.kind))
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Read this.", [("d.txt", DOC)], max_tokens=8, temperature=0)
        clock.now += 30
        assert engine.thread.call(sweeps.idle_check) is False
        clock.now += 31
        assert engine.thread.call(sweeps.idle_check) is True
        assert not engine.model_loaded and "model_unloaded" in events
        assert conv.stats().memory == "disk"
        reply = conv.send("What does node 2 hold?", max_tokens=12, temperature=0)
        assert reply and engine.model_loaded
        assert events.index("model_loaded", events.index("model_unloaded")) < events.index("kv_restored")
        conv.check()


def test_after_an_idle_unload_nothing_points_at_the_freed_model(tmp_path):
    """Issue 25: the model's resources are one value (`LoadedModel`) that the engine drops as it closes it, so
    no attribute of the engine or its collaborators still holds a freed context, pool or prefix."""
    from evoke_engine.conversations.loaded_model import LoadedModel
    from evoke_engine.kvcache.pool import SavedPool
    from evoke_engine.kvcache.prefixes import SharedPrefixes
    from evoke_engine.runtime.kv import KVCache
    from evoke_engine.runtime.runtime import Runtime

    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2)
    with Engine(settings, scheduler=False, prewarm=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Hello.", max_tokens=4, temperature=0)
        model = engine.model
        engine.unload_model()
        assert model.closed and model.rt.contexts == [] and model.rt.model is None
        assert engine.model is None and engine.lifecycle.model is None and not engine.model_loaded
        assert engine.diagnostics() is None
        freed = (LoadedModel, Runtime, KVCache, SharedPrefixes, SavedPool)
        for holder in (engine, engine.lifecycle, engine.turns):
            held = {name: value for name, value in vars(holder).items() if isinstance(value, freed)}
            assert held == {}, f"{type(holder).__name__} still holds {sorted(held)}"
        assert engine.kvfiles is not None and engine.kvfiles.has(conv.id)     # the files outlive the model
        assert conv.send("Hello again.", max_tokens=4, temperature=0) is not None
        assert engine.model is not model and engine.lifecycle.model is engine.model


@pytest.mark.parametrize("use", ["open", "tokenize", "new", "blocks", "min_budget"])
def test_a_reload_after_the_idle_unload_counts_as_activity(tmp_path, use):
    """Issue 25: whatever brings the model back stamps `last_activity`, else the next idle check unloads it
    again at once (and the next message reloads it once more)."""
    clock = FakeClock()
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2, model_idle_unload_s=60)
    with Engine(settings, clock=clock, scheduler=False, prewarm=False) as engine:
        from evoke_engine.sweeps import Sweeps

        sweeps = Sweeps(engine, scheduler=_ManualScheduler())
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Hello.", max_tokens=4, temperature=0)
        clock.now += 61
        assert engine.thread.call(sweeps.idle_check) is True and not engine.model_loaded
        clock.now += 600                                              # the user comes back much later
        {"open": lambda: engine.open_conversation(conv.id), "tokenize": lambda: engine.tokenize("hello"),
         "new": lambda: engine.new_conversation(system_prompt="You are brief.", tools=[]),
         "blocks": lambda: conv.blocks(), "min_budget": lambda: engine.min_budget_tokens()}[use]()
        assert engine.model_loaded
        clock.now += 1
        assert engine.thread.call(sweeps.idle_check) is False          # it stays for the message that follows
        assert engine.model_loaded
        clock.now += 60
        assert engine.thread.call(sweeps.idle_check) is True           # and leaves after a real idle


def test_using_a_loaded_model_without_a_turn_counts_as_activity(tmp_path):
    clock = FakeClock()
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2, model_idle_unload_s=60)
    with Engine(settings, clock=clock, scheduler=False, prewarm=False) as engine:
        from evoke_engine.sweeps import Sweeps

        sweeps = Sweeps(engine, scheduler=_ManualScheduler())
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        clock.now += 50
        engine.open_conversation(conv.id)                              # the user opens it: not idle
        clock.now += 50
        assert engine.thread.call(sweeps.idle_check) is False


def test_keepalive_rewarms_a_dropped_prefix_and_jobs_run_headless(tmp_path):
    settings = Settings(home=str(tmp_path), budget_tokens=384, n_ctx=4096, slots=2, keepalive_interval_s=5,
                        eviction_interval_s=5, tools_enabled=False, system_prompt="Default prompt.")
    with Engine(settings) as engine:
        jobs = {job["id"]: job for job in engine.sweeps.jobs()}
        assert jobs["keepalive"]["interval_s"] == 5 and jobs["eviction"]["interval_s"] == 5
        engine.thread.call(engine.diagnostics().prefixes.clear)                 # as if the prefix had been dropped
        deadline = time.time() + 20
        while engine.sweeps.runs["keepalive"] == 0 and time.time() < deadline:
            time.sleep(0.2)
        engine.thread.call(lambda: None)
        assert engine.sweeps.runs["keepalive"] >= 1
        assert len(engine.diagnostics().prefixes.all()) == 1


class _ManualScheduler:
    """A scheduler that never fires: tests call the sweeps themselves."""

    running = True

    def add_job(self, *args, **kwargs):
        return None

    def get_job(self, job_id):
        return None

    def get_jobs(self):
        return []

    def shutdown(self, wait=False):
        self.running = False


@pytest.fixture(autouse=True)
def _quiet_tokenizers(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
