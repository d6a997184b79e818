"""KVFileStore on real files in tmp_path: round trip, fuzzed and foreign files rejected and removed, TTL
classes with an injected clock, LRU disk budget, injected ENOSPC/EIO faults, SIGKILLed writers, check()."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash
from helpers.clock import FakeClock

from evoke_engine.store import StoreError
from evoke_engine.store import store_error as reasons
from evoke_engine.store.kvfiles import TTL_CLASSES, KVFileStore, model_hash, parse_ttl_class
from evoke_engine.store.kvheader import FORMAT_VERSION, HEADER, HEADER_SIZE, MAGIC, payload_digest

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "0123456789abcdef"
OTHER_MODEL = "fedcba9876543210"
MINUTE, HOUR = 60.0, 3600.0
TTL = {"short": 5 * MINUTE, "long": 60 * MINUTE, "extended": 24 * HOUR}
T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> KVFileStore:
    return KVFileStore(tmp_path, MODEL, TTL, clock=clock)


def payload_of(seed: int, size: int = 4096) -> bytes:
    return hashlib.shake_256(seed.to_bytes(8, "little")).digest(size)


def files_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir()) if directory.exists() else []


# -- names and hashes -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("filename", "ttl_class"), [
    ("abc.short.bin", "short"), ("abc.long.bin", "long"), ("abc.extended.bin", "extended"),
    ("abc.bin", "long"), ("abc", "long"), ("abc.weird.bin", "long"), ("a-b_c.short.bin", "short"),
])
def test_parse_ttl_class(filename: str, ttl_class: str) -> None:
    assert parse_ttl_class(filename) == ttl_class


def test_model_hash_is_short_and_tracks_identity_and_parameters(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    first = model_hash(str(model), "f16", 4096, 4)
    assert len(first) == 16 and int(first, 16) >= 0
    assert model_hash(str(tmp_path / "." / "model.gguf"), "f16", 4096, 4) == first  # resolved path
    others = {model_hash(str(model), "q8_0", 4096, 4), model_hash(str(model), "f16", 8192, 4),
              model_hash(str(model), "f16", 4096, 4, "off"),
              model_hash(str(model), "f16", 4096, 5)}
    assert first not in others and len(others) == 4
    model.write_bytes(b"other weights")
    os.utime(model, ns=(1, 1))
    assert model_hash(str(model), "f16", 4096, 4) != first
    with pytest.raises(StoreError, match="does not exist") as caught:
        model_hash(str(tmp_path / "missing.gguf"), "f16", 4096, 4)
    assert caught.value.reason == reasons.MISSING


def test_bad_arguments_are_value_errors(tmp_path: Path, store: KVFileStore) -> None:
    with pytest.raises(ValueError, match="model hash"):
        KVFileStore(tmp_path, "not-a-hash")
    with pytest.raises(ValueError, match="lacks TTL classes"):
        KVFileStore(tmp_path, MODEL, {"short": 1.0})
    for bad_id in ["", "../escape", "a/b", "with.dot", "x" * 129]:
        with pytest.raises(ValueError, match="conversation id"):
            store.write(bad_id, "long", b"x")
    with pytest.raises(ValueError, match="unknown TTL class"):
        store.write("c1", "forever", b"x")


# -- round trip and layout ------------------------------------------------------------------------------

def test_round_trip_and_header_layout(tmp_path: Path, store: KVFileStore) -> None:
    payload = payload_of(1, 100_000)
    path = store.write("c1", "long", payload)
    assert path == tmp_path / "kv" / MODEL / "c1.long.bin"
    raw = path.read_bytes()
    assert HEADER_SIZE == 62 and len(raw) == HEADER_SIZE + len(payload)
    digest = xxhash.xxh3_128_digest(payload) + bytes(16)
    assert HEADER.unpack_from(raw) == (b"EVKV", 2, MODEL.encode(), len(payload), digest)
    assert store.has("c1") and not store.has("c2")
    assert store.read("c1") == payload
    assert store.read("c2") is None
    assert store.write("empty", "short", b"").exists() and store.read("empty") == b""
    assert store.write("view", "short", memoryview(bytearray(b"abc"))) and store.read("view") == b"abc"


def test_new_class_replaces_other_class_files(store: KVFileStore) -> None:
    store.write("c1", "long", payload_of(1))
    store.write("c1", "short", payload_of(2))
    assert files_in(store.directory) == ["c1.short.bin"]
    assert store.read("c1") == payload_of(2)
    store.write("c1", "extended", payload_of(3))
    assert files_in(store.directory) == ["c1.extended.bin"]


def test_remove(store: KVFileStore) -> None:
    store.write("c1", "long", b"abc")
    assert store.remove("c1") is True
    assert store.remove("c1") is False
    assert store.read("c1") is None and files_in(store.directory) == []


def test_read_prefers_newest_file_and_drops_stale_duplicates(store: KVFileStore, clock: FakeClock) -> None:
    """A crash between the rename and deleting the other class's file leaves two files: newest wins."""
    old = store.write("c1", "long", payload_of(1))
    kept = old.read_bytes()
    clock.advance(10)
    store.write("c1", "short", payload_of(2))
    old.write_bytes(kept)
    os.utime(old, (clock.now - 10, clock.now - 10))
    assert store.read("c1") == payload_of(2)
    assert files_in(store.directory) == ["c1.short.bin"]



def test_a_version_1_file_checked_by_sha256_still_reads(store: KVFileStore, clock: FakeClock) -> None:
    """Files written before the digest moved to xxh3-128 stay usable: the version names the digest."""
    payload = payload_of(3, 5000)
    _plant(store, clock, HEADER.pack(MAGIC, 1, MODEL.encode(), len(payload), hashlib.sha256(payload).digest())
           + payload)
    assert store.read("c1") == payload
    damaged = bytearray(payload)
    damaged[-1] ^= 1
    _plant(store, clock, HEADER.pack(MAGIC, 1, MODEL.encode(), len(payload), hashlib.sha256(payload).digest())
           + bytes(damaged))
    assert store.read("c1") is None

# -- damaged and foreign files --------------------------------------------------------------------------

PAYLOAD = payload_of(7, 1000)
DIGEST = payload_digest(PAYLOAD)
VALID = HEADER.pack(MAGIC, FORMAT_VERSION, MODEL.encode(), len(PAYLOAD), DIGEST) + PAYLOAD


def _flip(offset: int) -> bytes:
    damaged = bytearray(VALID)
    damaged[offset] ^= 0x5A
    return bytes(damaged)


DAMAGED = {
    "empty": (b"", "empty file"),
    **{f"header-cut-{n}": (VALID[:n], "truncated header|bad magic") for n in (1, 3, 4, 5, 6, 21, 30, 61)},
    **{f"payload-cut-{n}": (VALID[:n], "truncated payload")
       for n in (62, 63, 62 + 500, len(VALID) - 1)},
    "trailing-byte": (VALID + b"\0", "trailing bytes"),
    **{f"flip-{offset}": (_flip(offset), reason) for offset, reason in [
        (0, "bad magic"), (3, "bad magic"), (4, "format version"), (5, "format version"),
        (6, "written for model"), (21, "written for model"), (22, "payload"), (29, "payload"),
        (30, "checksum"), (61, "checksum"), (62, "checksum"), (62 + 500, "checksum"),
        (len(VALID) - 1, "checksum"),
    ]},
    "other-model": (HEADER.pack(MAGIC, FORMAT_VERSION, OTHER_MODEL.encode(), len(PAYLOAD), DIGEST) + PAYLOAD,
                    "written for model"),
    "future-version": (HEADER.pack(MAGIC, FORMAT_VERSION + 1, MODEL.encode(), len(PAYLOAD), DIGEST) + PAYLOAD,
                       f"format version {FORMAT_VERSION + 1}"),
    "version-1-digest-under-version-2": (HEADER.pack(MAGIC, 2, MODEL.encode(), len(PAYLOAD),
                                                     hashlib.sha256(PAYLOAD).digest()) + PAYLOAD, "checksum"),
    "bad-magic": (b"GGUF" + VALID[4:], "bad magic"),
    "huge-length": (VALID[:22] + struct.pack("<Q", 2**63) + VALID[30:], "truncated payload"),
}


def _plant(store: KVFileStore, clock: FakeClock, content: bytes, name: str = "c1.long.bin") -> Path:
    store.directory.mkdir(parents=True, exist_ok=True)
    path = store.directory / name
    path.write_bytes(content)
    os.utime(path, (clock.now, clock.now))
    return path


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_file_is_rejected_removed_and_logged(store: KVFileStore, clock: FakeClock,
                                                     caplog: pytest.LogCaptureFixture, case: str) -> None:
    content, reason = DAMAGED[case]
    path = _plant(store, clock, content)
    with caplog.at_level(logging.WARNING, logger="evoke_engine.store.kvfiles"):
        assert store.read("c1") is None
    assert not path.exists()
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "c1.long.bin" in messages
    assert any(part in messages for part in reason.split("|")), messages


def test_planted_valid_file_is_accepted(store: KVFileStore, clock: FakeClock) -> None:
    _plant(store, clock, VALID)
    assert store.read("c1") == PAYLOAD


def test_random_damage_is_never_returned(store: KVFileStore, clock: FakeClock) -> None:
    rng = random.Random(20240601)
    for _ in range(300):
        damaged = bytearray(VALID)
        action = rng.choice(["cut", "flip", "splice"])
        if action == "cut":
            damaged = damaged[:rng.randrange(len(VALID))]
        elif action == "flip":
            for _ in range(rng.randint(1, 4)):
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        else:
            start = rng.randrange(len(damaged))
            damaged[start:start + 16] = rng.randbytes(16)
        if bytes(damaged) == VALID:
            continue
        _plant(store, clock, bytes(damaged), rng.choice(["c1.short.bin", "c1.long.bin", "c1.bin"]))
        assert store.read("c1") is None
        assert files_in(store.directory) == []


def test_check_removes_header_level_problems_and_leftovers(store: KVFileStore, clock: FakeClock) -> None:
    store.write("good", "long", PAYLOAD)
    _plant(store, clock, DAMAGED["future-version"][0], "future.long.bin")
    _plant(store, clock, DAMAGED["payload-cut-63"][0], "cut.short.bin")
    _plant(store, clock, DAMAGED["other-model"][0], "foreign.bin")
    _plant(store, clock, b"partial", ".good.0123456789abcdef.tmp")
    _plant(store, clock, b"?", "notes.txt")
    _plant(store, clock, VALID, "dup.long.bin")
    clock.advance(1)
    _plant(store, clock, VALID, "dup.short.bin")
    (store.directory / "subfolder").mkdir()
    found = store.check(fix=False)
    assert sorted(found) == sorted(f"{MODEL}/{name}" for name in [
        "future.long.bin", "cut.short.bin", "foreign.bin", ".good.0123456789abcdef.tmp", "notes.txt",
        "dup.long.bin"])
    assert len(files_in(store.directory)) == 9
    assert sorted(store.check(fix=True)) == sorted(found)
    assert files_in(store.directory) == ["dup.short.bin", "good.long.bin", "subfolder"]
    assert store.check() == []
    assert store.read("good") == PAYLOAD


# -- TTL classes and expiry -----------------------------------------------------------------------------

def test_ttl_classes_expire_on_their_horizon(store: KVFileStore, clock: FakeClock) -> None:
    for ttl_class in TTL_CLASSES:
        store.write(ttl_class, ttl_class, payload_of(len(ttl_class)))
    _plant(store, clock, VALID, "unclassed.bin")
    checkpoints = [
        (5 * MINUTE, {"short", "long", "extended", "unclassed"}),
        (5 * MINUTE + 1, {"long", "extended", "unclassed"}),
        (60 * MINUTE, {"long", "extended", "unclassed"}),
        (60 * MINUTE + 1, {"extended"}),
        (24 * HOUR, {"extended"}),
        (24 * HOUR + 1, set()),
    ]
    for offset, alive in checkpoints:
        clock.now = T0 + offset
        assert {c for c in ["short", "long", "extended", "unclassed"] if store.has(c)} == alive, offset


def test_expired_file_reads_as_absent_and_is_removed(store: KVFileStore, clock: FakeClock) -> None:
    path = store.write("c1", "short", PAYLOAD)
    clock.advance(5 * MINUTE + 1)
    assert store.read("c1") is None
    assert not path.exists()


def test_read_refreshes_mtime(store: KVFileStore, clock: FakeClock) -> None:
    path = store.write("c1", "short", PAYLOAD)
    clock.advance(4 * MINUTE)
    assert store.read("c1") == PAYLOAD
    assert path.stat().st_mtime == pytest.approx(clock.now)
    clock.advance(4 * MINUTE)
    assert store.read("c1") == PAYLOAD  # 8 minutes after the write, 4 after the last use


def test_sweep_is_bounded_and_reports_names(store: KVFileStore, clock: FakeClock) -> None:
    for index in range(7):
        store.write(f"s{index}", "short", b"x")
    store.write("keep", "long", b"y")
    _plant(store, clock, b"half-written", ".s0.00000000000000aa.tmp")
    clock.advance(5 * MINUTE + 1)
    first = store.sweep_expired(max_files=3)
    assert len(first) == 3 and all(name.startswith(f"{MODEL}/s") for name in first)
    rest = store.sweep_expired()
    assert sorted(first + rest) == [f"{MODEL}/s{index}.short.bin" for index in range(7)]
    assert files_in(store.directory) == [".s0.00000000000000aa.tmp", "keep.long.bin"]
    clock.advance(24 * HOUR)  # temp files older than the longest TTL are orphans
    assert sorted(store.sweep_expired()) == [f"{MODEL}/.s0.00000000000000aa.tmp", f"{MODEL}/keep.long.bin"]


def test_sweep_all_models_reaches_sibling_folders(tmp_path: Path, store: KVFileStore,
                                                   clock: FakeClock) -> None:
    old_model = KVFileStore(tmp_path, OTHER_MODEL, TTL, clock=clock)
    old_model.write("c1", "short", b"old")
    store.write("c1", "extended", b"new")
    (tmp_path / "kv" / "not-a-model-hash").mkdir()
    (tmp_path / "kv" / "not-a-model-hash" / "x.short.bin").write_bytes(b"left alone")
    clock.advance(HOUR)
    assert store.sweep_expired() == []
    assert store.sweep_expired(all_models=True) == [f"{OTHER_MODEL}/c1.short.bin"]
    assert not old_model.directory.exists()  # emptied sibling folder removed
    assert store.read("c1") == b"new"
    assert (tmp_path / "kv" / "not-a-model-hash" / "x.short.bin").exists()


# -- disk budget ----------------------------------------------------------------------------------------

def test_disk_budget_evicts_other_models_then_least_recently_used(tmp_path: Path, store: KVFileStore,
                                                                  clock: FakeClock) -> None:
    size = 1000 - HEADER_SIZE
    KVFileStore(tmp_path, OTHER_MODEL, TTL, clock=clock).write("old", "long", bytes(size))
    for index in range(5):
        clock.advance(1)
        store.write(f"c{index}", "long", bytes(size))
    clock.advance(1)
    assert store.read("c0") is not None  # c0 becomes the most recently used
    assert store.total_bytes() == 6000 and store.total_bytes(all_models=False) == 5000
    assert store.enforce_disk_budget(3500) == [f"{OTHER_MODEL}/old.long.bin", f"{MODEL}/c1.long.bin",
                                               f"{MODEL}/c2.long.bin"]
    assert store.total_bytes() == 3000
    assert files_in(store.directory) == ["c0.long.bin", "c3.long.bin", "c4.long.bin"]
    assert store.enforce_disk_budget(3000) == []
    assert len(store.enforce_disk_budget(0)) == 3 and store.total_bytes() == 0


# -- injected faults ------------------------------------------------------------------------------------

def _failing(real: Callable[..., object], error: OSError, after_calls: int) -> Callable[..., object]:
    calls = 0

    def wrapper(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls > after_calls:
            raise error
        return real(*args, **kwargs)
    return wrapper


@pytest.mark.parametrize(("function", "after_calls", "error", "reason"), [
    ("write", 0, errno.ENOSPC, reasons.DISK_FULL),   # no byte written
    ("write", 1, errno.ENOSPC, reasons.DISK_FULL),   # header written, payload not
    ("write", 2, errno.ENOSPC, reasons.DISK_FULL),   # inside the payload
    ("fsync", 0, errno.ENOSPC, reasons.DISK_FULL),
    ("replace", 0, errno.EIO, reasons.IO),
    ("open", 0, errno.EROFS, reasons.READ_ONLY),
])
def test_write_fault_keeps_old_file_and_leaves_no_temp(store: KVFileStore, monkeypatch: pytest.MonkeyPatch,
                                                       function: str, after_calls: int, error: int,
                                                       reason: str) -> None:
    old = payload_of(1, 20 << 20)
    store.write("c1", "long", old)
    new = payload_of(2, 20 << 20)
    monkeypatch.setattr(os, function, _failing(getattr(os, function), OSError(error, os.strerror(error)),
                                               after_calls))
    try:
        with pytest.raises(StoreError) as caught:
            store.write("c1", "short", new)
    finally:
        monkeypatch.undo()
    assert caught.value.reason == reason
    assert "c1.short.bin" in str(caught.value)
    if reason == reasons.DISK_FULL:
        assert "disk is full" in str(caught.value)
    assert files_in(store.directory) == ["c1.long.bin"]
    assert store.read("c1") == old


# -- crash safety ---------------------------------------------------------------------------------------

WRITER = """
import struct, sys
from pathlib import Path
from evoke_engine.store.kvfiles import KVFileStore
store = KVFileStore(Path(sys.argv[1]), sys.argv[2])
size = int(sys.argv[3])
print("ready", flush=True)
generation = int(sys.argv[4])
while True:
    generation += 1
    payload = struct.pack("<Q", generation) + bytes([generation % 251]) * size
    store.write("crash", ("short", "long", "extended")[generation % 3], payload)
"""


def _expected_payload(payload: bytes, size: int) -> bytes:
    (generation,) = struct.unpack_from("<Q", payload)
    return struct.pack("<Q", generation) + bytes([generation % 251]) * size


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkilled_writer_never_leaves_corrupt_data(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    size = 8 << 20
    store = KVFileStore(tmp_path, MODEL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    outcomes = []
    newest_generation = -1
    deadline = time.monotonic() + 8.0
    for round_index in range(12):
        if time.monotonic() > deadline:
            break
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), MODEL, str(size),
                                   str(round_index * 1000)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE)
        try:
            assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0.0, 0.15))
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            if writer.stdout is not None:
                writer.stdout.close()
        leftovers = [name for name in files_in(store.directory) if name.endswith(".tmp")]
        payload = store.read("crash")
        if payload is not None:
            assert len(payload) == 8 + size, f"seed {seed}"
            assert payload == _expected_payload(payload, size), f"seed {seed}: damaged payload returned"
            (generation,) = struct.unpack_from("<Q", payload)
            assert generation >= newest_generation, f"seed {seed}: went back to an older payload"
            newest_generation = generation
        else:
            assert newest_generation < 0, f"seed {seed}: a complete file was lost by a killed writer"
        store.check(fix=True)
        assert not [name for name in files_in(store.directory) if name.endswith(".tmp")], f"seed {seed}"
        assert store.read("crash") == payload, f"seed {seed}: check() changed a valid file"
        outcomes.append((payload is not None, bool(leftovers)))
    assert len(outcomes) >= 3, f"only {len(outcomes)} rounds fit the time bound"


def test_threads_share_one_store_and_end_consistent(store: KVFileStore) -> None:
    errors: list[BaseException] = []

    def worker(thread_index: int) -> None:
        rng = random.Random(thread_index)
        try:
            for step in range(40):
                conversation_id = f"c{rng.randrange(4)}"
                action = rng.random()
                if action < 0.5:
                    store.write(conversation_id, rng.choice(TTL_CLASSES), payload_of(step, 2000))
                elif action < 0.9:
                    payload = store.read(conversation_id)
                    assert payload is None or bytes(payload) in {payload_of(n, 2000) for n in range(40)}
                else:
                    store.remove(conversation_id)
                store.sweep_expired(max_files=2)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.check(fix=False) == []
    assert all(name.count(".") == 2 for name in files_in(store.directory))


def test_a_file_that_would_cross_the_disk_reserve_is_not_written_and_the_old_one_stays(tmp_path, clock, monkeypatch):
    """Issue 57 item 7: KV files keep the chat history's reserve as the spill does; a rewrite counts only what it
    adds over the file it replaces."""
    store = KVFileStore(tmp_path, MODEL, TTL, clock=clock, reserve_bytes=1 << 20)
    free = {"bytes": (1 << 20) + 64 * 1024}                       # 64 KiB above the reserve
    usage = shutil.disk_usage

    def disk_usage(path):
        real = usage(path)
        return type(real)(real.total, real.used, free["bytes"])
    monkeypatch.setattr("evoke_engine.store.disk_room.shutil.disk_usage", disk_usage)
    first = payload_of(1, 40 * 1024)
    store.write("c1", "long", first)
    assert bytes(store.read("c1")) == first
    store.write("c1", "long", payload_of(2, 40 * 1024))          # the same size again: adds nothing
    with pytest.raises(StoreError) as refused:
        store.write("c1", "long", payload_of(3, 200 * 1024))
    assert refused.value.reason == reasons.DISK_FULL and "chat history" in str(refused.value)
    assert bytes(store.read("c1")) == payload_of(2, 40 * 1024)    # the old file intact
    with pytest.raises(StoreError):
        store.write("c2", "long", payload_of(4, 80 * 1024))
    assert store.read("c2") is None and not [p for p in store.directory.iterdir() if "c2" in p.name]
