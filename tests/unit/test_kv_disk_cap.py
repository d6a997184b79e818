"""The KV disk cap (issue 41, item 11) on the real `KVFileStore` with a fake clock: every write ends under the cap,
other models' files first, then the least recently used (a read or a keep-alive touch counts as a use), never the
file just written; a new cap applies at once."""

from __future__ import annotations

import pytest
from helpers.clock import FakeClock

from evoke_engine.store.kvfiles import KVFileStore

pytestmark = pytest.mark.unit

MODEL, OTHER_MODEL = "0123456789abcdef", "fedcba9876543210"
FILE = 1000                                     # payload bytes of each file (the header adds a little)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _store(tmp_path, clock, model: str = MODEL, cap: int | None = None) -> KVFileStore:
    return KVFileStore(tmp_path, model, clock=clock, disk_budget_bytes=cap)


def _write(store: KVFileStore, clock: FakeClock, *names: str) -> None:
    for name in names:
        store.write(name, "long", bytes(FILE))
        clock.advance(10)


def test_a_write_over_the_cap_deletes_the_least_recently_used_files_first(tmp_path, clock):
    store = _store(tmp_path, clock)
    _write(store, clock, "a", "b", "c")
    one = store.total_bytes() // 3
    assert store.read("a") is not None                         # a is used again: b is now the oldest
    clock.advance(10)
    assert store.set_disk_budget(3 * one) == []                # under the cap: nothing goes
    _write(store, clock, "d")
    assert store.conversations() == ["a", "c", "d"]
    store.touch("c")                                           # keep-alive: c is used, a is the oldest
    clock.advance(10)
    _write(store, clock, "e")
    assert store.conversations() == ["c", "d", "e"] and store.total_bytes() <= 3 * one


def test_other_models_files_go_before_this_models(tmp_path, clock):
    store, other = _store(tmp_path, clock), _store(tmp_path, clock, OTHER_MODEL)
    _write(store, clock, "a")
    _write(other, clock, "newer")                              # used after "a", but this model cannot read it
    one = store.total_bytes() // 2
    store.set_disk_budget(2 * one)
    _write(store, clock, "b")
    assert store.conversations() == ["a", "b"] and not other.has("newer")


def test_the_file_just_written_stays_even_alone_over_the_cap(tmp_path, clock):
    store = _store(tmp_path, clock, cap=10)
    _write(store, clock, "a", "b")
    assert store.conversations() == ["b"] and store.total_bytes() > 10


def test_a_lower_cap_applies_at_once_and_none_lifts_it(tmp_path, clock):
    store = _store(tmp_path, clock)
    _write(store, clock, "a", "b", "c")
    one = store.total_bytes() // 3
    assert store.set_disk_budget(one) == [f"{MODEL}/a.long.bin", f"{MODEL}/b.long.bin"]
    assert store.disk_budget_bytes == one
    store.set_disk_budget(None)
    _write(store, clock, "d", "e")
    assert store.conversations() == ["c", "d", "e"]
