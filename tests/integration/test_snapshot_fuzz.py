"""Structure-aware fuzzing of KV files: payloads from the real encoder, mutated and re-signed. Opening one
never raises out of the public API, the next greedy reply equals a clean rebuild's, the history stays
intact, and the file is gone or valid afterwards. A few dozen examples here, 1000 in the slow test."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
from helpers.fuzz_snapshots import clone_conversation, join, mutate, split
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evoke_engine import Engine, Settings
from evoke_engine.memory.snapshot import decode_payload

DOC = "\n".join(f"Entry {i}: the cache at node {i} holds {i * 3} pages." for i in range(10))
QUESTION = "What does node 5 hold?"
REPLY_TOKENS = 4


class Rig:
    """One engine, a real conversation's payload (aimed at the id every example reuses) and the reply a
    clean rebuild gives to QUESTION, computed once."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.events: list = []
        engine.subscribe(self.events.append)
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        conv.send("Read this.", [("d.txt", DOC)], max_tokens=6, temperature=0)
        self.source = conv.id
        assert conv.stats().evictions > 0              # saved blocks exist: their spans get fuzzed too
        engine.release_conversation(conv.id)
        self.history = [(m.role, m.text) for m in engine.history.messages(conv.id)]
        self.target = uuid.uuid4().hex
        head, body = split(bytes(engine.kvfiles.read(conv.id)))
        head["conversation_id"] = self.target
        self.payload = join(head, body)
        self.counts = {"tried": 0, "restored": 0, "rejected": 0, "failed_after_checks": 0, "escapes": 0,
                       "corrupt_loads": 0}
        self.reference, _ = self.open_and_ask(None)

    def open_and_ask(self, payload: bytes | None) -> tuple[str, list]:
        """Reply to QUESTION in a fresh copy of the conversation whose KV file is `payload`; its events."""
        engine = self.engine
        clone_conversation(engine, self.source, self.target)
        self.events.clear()
        try:
            if payload is not None:
                engine.kvfiles.write(self.target, "long", payload)
            conv = engine.open_conversation(self.target)
            conv.check()
            if engine.kvfiles.has(self.target):           # the file is gone, or valid
                decode_payload(engine.kvfiles.read(self.target, refresh=False))
            before = conv.stats().evictions
            reply = conv.send(QUESTION, max_tokens=REPLY_TOKENS, temperature=0)
            assert conv.stats().evictions == before    # the next turn evicts and recovers nothing here
            messages = [(m["role"], m["text"]) for m in conv.messages()]
            assert messages == [*self.history, ("user", QUESTION), ("assistant", reply)]    # history intact
        finally:
            events = [e for e in self.events if e.conversation_id == self.target]
            engine.delete_conversation(self.target)
        return reply, events

    def run_one(self, payload: bytes) -> None:
        self.counts["tried"] += 1
        try:
            reply, events = self.open_and_ask(payload)
        except Exception:
            self.counts["escapes"] += 1
            raise
        kinds = [e.kind for e in events]
        if "kv_restored" in kinds:
            self.counts["restored"] += 1
            if reply != self.reference:
                self.counts["corrupt_loads"] += 1
        else:
            assert kinds.count("kv_rebuilt") == 1, kinds
            message = next(e.message for e in events if e.kind == "kv_rebuilt")
            self.counts["failed_after_checks" if "did not apply" in message else "rejected"] += 1
        assert reply == self.reference, [(e.kind, e.message) for e in events]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    config = Settings(home=str(tmp_path_factory.mktemp("fuzz")), budget_tokens=192, n_ctx=2048, slots=2,
                      recovery_top_k=0, block_tokens=32, low_watermark=0.5)     # small: a rebuild is cheap
    with Engine(config, scheduler=False, prewarm=False) as engine:
        yield Rig(engine)


def test_the_unmutated_file_restores_and_gives_the_rebuilds_reply(rig):
    reply, events = rig.open_and_ask(rig.payload)
    assert "kv_restored" in [e.kind for e in events] and "kv_rebuilt" not in [e.kind for e in events]
    assert reply == rig.reference


@settings(max_examples=12, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_snapshots_never_break_a_conversation(rig, data):
    payload, _ = mutate(rig.payload, data)
    rig.run_one(payload)
    assert rig.counts["failed_after_checks"] == 0      # every unusable file was caught before it was applied


@pytest.mark.slow
@pytest.mark.soak                                      # make test-soak: about 17 minutes on a quiet 2-core machine
@settings(max_examples=1000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_snapshots_never_break_a_conversation_1000(rig, data):
    rig.counts.setdefault("started", time.time())
    payload, _ = mutate(rig.payload, data)
    rig.run_one(payload)
    rig.counts["seconds"] = round(time.time() - rig.counts["started"], 1)
    report = os.environ.get("EVOKE_FUZZ_REPORT")
    if report:
        with open(report, "w") as fh:
            json.dump(rig.counts, fh)
