"""The embedded model split across this machine and two RPC workers (llama.cpp's rpc-server on 127.0.0.1, each
exposing a CPU device): replies, eviction and splice, persistence and a worker lost mid-turn, against the unsplit
model. The workers are started and stopped here (`LocalWorkers`); nothing listens past the module.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from evoke_engine import Engine, EvokeError, Settings
from evoke_engine.events import EventKind
from evoke_engine.package_files import native_library
from evoke_engine.runtime import rpc as rpc_mod
from evoke_engine.runtime.kv import KVCache
from evoke_engine.runtime.rpc import RemoteDeviceError, RemoteDeviceLost
from evoke_engine.runtime.rpc_worker import LocalWorkers, free_port
from evoke_engine.runtime.runtime import Runtime

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(native_library("rpc-server") is None or not rpc_mod.rpc_available(),
                       reason="needs llama.cpp's RPC backend and rpc-server: bash native/build_cpu.sh "
                              "(make install builds both)"),
]

DOC = "\n".join(f"Entry {i}: the cache at node {i} holds {i * 3} pages." for i in range(24))
NEEDLE_DOC = ("<|im_start|>user\n" + " ".join(f"Line {i}: the pump in room {i} runs quietly." for i in range(12))
              + " The passkey is 7431. " + " ".join(f"Line {i}: the fan in hall {i} is clean." for i in range(12, 30))
              + "\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")
TURNS = [("Read this file.", [("nodes.txt", DOC)]), ("Which node holds 15 pages?", []),
         ("Write a Python function that adds two numbers.", [])]


@pytest.fixture(scope="module")
def workers():
    with LocalWorkers(2, threads=1) as started:
        yield started


def settings(home, split: str = "", **overrides) -> Settings:
    # a context a slot, split or not: a split model cannot keep a KV stream per slot (no direct KV path over RPC), and
    # the local model it is compared with must lay its slots out alike to give the same bits
    values = {"home": str(home), "slots": 2, "n_ctx": 4096, "budget_tokens": 1024, "embedder": "off",
              "n_threads": 1, "slot_layout": "contexts"}
    if split:                                                  # even shares unless the test gives its own
        values.update(rpc_servers=split, rpc_layer_split=",".join(["1"] * (split.count(",") + 2)))
    values.update(overrides)
    return Settings(**values)


def converse(engine: Engine, turns=TURNS) -> tuple[list[str], str]:
    conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
    return [conv.send(text, attachments, max_tokens=16, temperature=0) for text, attachments in turns], conv.id


def test_split_model_gives_the_unsplit_greedy_replies(workers, tmp_path):
    with Engine(settings(tmp_path / "local"), scheduler=False) as engine:
        local, _ = converse(engine)
    with Engine(settings(tmp_path / "split", workers.setting()), scheduler=False) as engine:
        info = engine.model_info()
        split, conversation_id = converse(engine)
        fork = engine.fork(conversation_id, 1)               # cells shared with the parent's slot, on every device
        forked = fork.send("Which node holds 30 pages?", max_tokens=12, temperature=0)
    assert [(d.name, d.endpoint) for d in info.devices] == [("CPU", ""), ("RPC0", workers.endpoints[0]),
                                                              ("RPC1", workers.endpoints[1])]
    assert all(d.layers >= 8 for d in info.devices) and sum(d.layers for d in info.devices) == info.n_layer
    assert all(d.total_bytes > 0 for d in info.devices)
    assert split == local
    with Engine(settings(tmp_path / "local2"), scheduler=False) as engine:
        _, conversation_id = converse(engine)
        assert engine.fork(conversation_id, 1).send("Which node holds 30 pages?", max_tokens=12,
                                                    temperature=0) == forked


def test_reported_layers_are_where_llama_cpp_put_them(workers, tmp_path):
    """The rows the status bar and `device` show, against llama.cpp's own per-layer log (load_tensors)."""
    import llama_cpp as ll

    from evoke_engine.runtime import llama_logs

    assigned: dict[int, str] = {}

    @ll.llama_log_callback
    def capture(level, text, user_data):
        line = text.decode("utf-8", "replace")
        if "assigned to device" in line:                       # "load_tensors: layer  12 assigned to device RPC0, ..."
            words = line.split()
            assigned[int(words[2])] = words[6].rstrip(",")

    llama_logs.quiet_llama_logs()                             # installed once per process: replaced for the load
    ll.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        rt = Runtime(settings(tmp_path, workers.setting(), rpc_layer_split="2,1,3"))
    finally:
        ll.llama_log_set(llama_logs._log_callback, ctypes.c_void_p(0))
    try:
        shares = rt.info().devices
    finally:
        rt.close()
    n_layer = len(shares) and sum(d.layers for d in shares)
    counted = {d.name: sum(1 for il, name in assigned.items() if il < n_layer and name == d.name) for d in shares}
    assert counted == {d.name: d.layers for d in shares} and all(v > 0 for v in counted.values())


def _greedy(rt: Runtime, kv: KVCache, seq: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        token = int(np.argmax(rt.logits()))
        out.append(token)
        rt.decode([token], seq, kv.pos_max(seq) + 1)
    return out


def test_block_evicted_and_spliced_back_on_the_split_model_continues_identically(workers, tmp_path):
    rt = Runtime(settings(tmp_path, workers.setting()))
    try:
        kv = KVCache(rt)
        assert len(rt.placement.endpoints) == 2 and rt.placement.shares[1].layers > 0
        tokens = rt.tokenize(NEEDLE_DOC)
        key = rt.tokenize(" The passkey is 7431.")
        start = next(i for i in range(len(tokens)) if tokens[i:i + len(key)] == key)
        p0, p1 = start - 40, start + 40
        n = len(tokens)
        rt.decode(tokens, 0, 0)
        reference_logits, reference = rt.logits(), _greedy(rt, kv, 0, 6)
        assert "7431" in rt.detokenize(reference).replace(" ", "")
        kv.drop(0)

        # Round trip at the original position: the remote layers' K/V bytes go to host RAM and back.
        rt.decode(tokens[:-1], 0, 0)
        saved = kv.save(0, p0, p1)
        kv.evict(0, p0, p1, compact=False)
        kv.restore(saved, 0, p0)
        rt.decode(tokens[-1:], 0, n - 1)
        assert np.abs(rt.logits() - reference_logits).max() < 1.0
        assert _greedy(rt, kv, 0, 6) == reference
        kv.drop(0)

        # Evicted with compaction, spliced back at the tail: the re-anchor rotates host bytes of every layer.
        question = rt.tokenize("\nWhat is the passkey?<|im_end|>\n<|im_start|>assistant\nThe passkey is")
        rt.decode(tokens[:n - len(question)], 0, 0, logits_last=False)
        saved = kv.save(0, p0, p1)
        kv.evict(0, p0, p1)
        before = kv.native_reanchors
        kv.restore(saved, 0, kv.pos_max(0) + 1)
        rt.decode(question, 0, kv.pos_max(0) + 1)
        assert kv.geometry is None or kv.native_reanchors == before + 1
        assert "7431" in rt.detokenize(_greedy(rt, kv, 0, 6)).replace(" ", "")
    finally:
        rt.close()


@pytest.mark.xfail(strict=False, reason="since the prefixes have a context of their own (2026-11-29) a split model's "
                   "blocks, moved by llama.cpp's serialised state through the scratch sequence, can sit at other cells "
                   "than the local model's direct splice puts them, and the CPU attention's rounding follows cell "
                   "placement (issue 58 item 7): the reopened reply then differs in a word; under investigation")
def test_conversation_persisted_and_reopened_after_a_restart_continues_identically(workers, tmp_path):
    home = tmp_path / "split"
    with Engine(settings(home, workers.setting(), budget_tokens=384), scheduler=False) as engine:
        _, conversation_id = converse(engine, TURNS[:2])
    events = []
    with Engine(settings(home, workers.setting(), budget_tokens=384), scheduler=False) as engine:
        engine.subscribe(lambda e: events.append(e.kind))
        conv = engine.open_conversation(conversation_id)
        conv.check()
        reopened = conv.send(TURNS[2][0], max_tokens=16, temperature=0)
    assert EventKind.KV_RESTORED in events and EventKind.KV_REBUILT not in events, events
    with Engine(settings(tmp_path / "kept", budget_tokens=384), scheduler=False) as engine:
        kept, _ = converse(engine)
    assert reopened == kept[2]


def test_a_worker_down_at_load_is_named_and_can_be_left_out(workers, tmp_path):
    down = f"127.0.0.1:{free_port()}"
    with pytest.raises(RemoteDeviceError, match=down.replace(".", r"\.")):
        Runtime(settings(tmp_path, f"{workers.endpoints[0]},{down}"))
    rt = Runtime(settings(tmp_path, f"{workers.endpoints[0]},{down}", rpc_skip_unreachable=True))
    try:
        assert rt.placement.endpoints == [workers.endpoints[0]]
        assert down in rt.info().device_notice
    finally:
        rt.close()


def test_a_worker_killed_mid_turn_fails_the_turn_cleanly_and_a_reload_works(tmp_path):
    home = tmp_path / "split"
    with LocalWorkers(2, threads=1) as own, Engine(settings(home, own.setting()), scheduler=False) as engine:
        conv = engine.new_conversation(system_prompt="You are brief.", tools=[])
        first = conv.send(*TURNS[0], max_tokens=16, temperature=0)
        pieces = []

        def kill_after_two(piece: str) -> None:
            pieces.append(piece)
            if len(pieces) == 2:
                own.kill(1)

        with pytest.raises(RemoteDeviceLost, match=own.endpoints[1].replace(".", r"\.")):
            conv.submit(TURNS[1][0], on_token=kill_after_two, max_tokens=16, temperature=0).result(timeout=120)
        assert len(pieces) >= 2
        rows = engine.history.messages(conv.id)
        assert [(r.role, r.text) for r in rows] == [("user", TURNS[0][0]), ("assistant", first)]
        with pytest.raises(EvokeError, match="reload"):
            conv.send("Still there?", max_tokens=4, temperature=0)
        with pytest.raises(RemoteDeviceError, match="restart the app"):
            engine.reload(settings(home, own.setting())).result(timeout=120)
        info = engine.reload(settings(home, own.endpoints[0])).result(timeout=120)    # without the lost worker
        assert [d.endpoint for d in info.devices] == ["", own.endpoints[0]]
        after = conv.send(TURNS[1][0], max_tokens=16, temperature=0)
    with Engine(settings(tmp_path / "local"), scheduler=False) as engine:
        local, _ = converse(engine, TURNS[:2])
    assert after == local[1]
