"""The sweeps' decisions on a plain `SweepHost` (issue 25): idle release by TTL class, the focused conversation
kept, file expiry and the disk budget on a real `KVFileStore`, the idle unload, keep-alive touching stale files.
No model: the host is a handful of fields, the KV files are real files in a tmp dir, the clock is set by hand."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from helpers.clock import FakeClock

from evoke_engine.events import EventKind
from evoke_engine.settings import Settings
from evoke_engine.settings_hub import SettingsHub
from evoke_engine.store.kvfiles import KVFileStore
from evoke_engine.sweeps import SweepHost, Sweeps
from evoke_engine.worker import EngineThread

pytestmark = pytest.mark.unit
HASH = "0123456789abcdef"


@dataclass
class OpenConversation:
    id: str
    last_used: float
    pinned: bool = False

    @property
    def ttl_class(self) -> str:
        return "extended" if self.pinned else "long"


@dataclass
class OpenConversations:
    """The two calls the sweeps make on the lifecycle."""

    states: dict[str, OpenConversation] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)

    def open_states(self) -> list[OpenConversation]:
        return list(self.states.values())

    def release(self, state: OpenConversation) -> None:
        self.released.append(self.states.pop(state.id).id)


class ManualScheduler:
    """Never fires: the tests run the sweeps themselves. Records each job's interval as last scheduled."""

    running = True

    def __init__(self) -> None:
        self.intervals: dict[str, float] = {}

    def add_job(self, fn, trigger: str, *, seconds: float, id: str, **kwargs) -> None:
        self.intervals[id] = seconds

    def get_job(self, job_id: str) -> None:
        return None

    def get_jobs(self) -> list:
        return []

    def shutdown(self, wait: bool = False) -> None:
        self.running = False


class Host:
    """A `SweepHost` of plain fields (what the Engine is to the sweeps)."""

    def __init__(self, tmp_path, clock: FakeClock, **settings) -> None:
        self.settings_hub = SettingsHub(Settings(home=str(tmp_path / "home"), **settings))
        self.thread = EngineThread("sweeps-test")
        self.lifecycle = OpenConversations()
        self.cache_dir = tmp_path / "cache"
        self.kvfiles = KVFileStore(self.cache_dir, HASH, self.settings.ttl_seconds(), clock=clock)
        self.focused: str | None = None
        self.clock = clock
        self.last_activity = clock()
        self.model_loaded = True
        self.events: list = []
        self.prefix_warmed = 0

    @property
    def settings(self) -> Settings:
        return self.settings_hub.current

    def change(self, **changes) -> None:
        """Apply changed settings as the Engine does (here on the test's thread)."""
        self.settings_hub.apply(self.settings.replace(**changes))

    def warm_default_prefix(self) -> object:
        self.prefix_warmed += 1
        return None

    def unload_model(self, reason: str = "idle") -> None:
        self.model_loaded = False

    def emit(self, event) -> None:
        self.events.append(event)

    def file_time(self, conversation_id: str) -> float:
        return next(self.cache_dir.rglob(f"{conversation_id}.*.bin")).stat().st_mtime

    def open(self, conversation_id: str, *, pinned: bool = False, with_file: bool = True) -> OpenConversation:
        state = OpenConversation(conversation_id, self.clock(), pinned)
        self.lifecycle.states[conversation_id] = state
        if with_file:
            self.kvfiles.write(conversation_id, state.ttl_class, b"kv" * 64)
        return state


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def host(tmp_path, clock):
    made = Host(tmp_path, clock, ttl_long_s=3600, ttl_extended_s=86400, model_idle_unload_s=60)
    yield made
    made.thread.stop()


def sweeps_for(host: SweepHost) -> Sweeps:
    return Sweeps(host, scheduler=ManualScheduler())


def test_an_idle_conversation_leaves_after_its_ttl_class_and_the_focused_one_stays(host, clock):
    sweeps = sweeps_for(host)
    host.open("plain")
    host.open("pinned", pinned=True)
    host.open("focused")
    host.focused = "focused"
    clock.advance(3000)
    assert sweeps.eviction_sweep() == []                       # not idle long enough yet
    clock.advance(700)
    assert sweeps.eviction_sweep() == ["plain"]                # pinned: extended TTL; focused: never
    assert [e.kind for e in host.events] == [EventKind.RELEASED]
    clock.advance(90000)
    assert sweeps.eviction_sweep() == ["pinned"]
    assert host.lifecycle.released == ["plain", "pinned"] and sweeps.runs["eviction"] == 3


def test_expired_files_go_even_while_the_model_is_unloaded(host, clock):
    sweeps = sweeps_for(host)
    host.open("c")
    host.lifecycle.states.clear()                              # released before the unload
    host.model_loaded = False
    clock.advance(3601)
    assert sweeps.eviction_sweep() == []
    assert not host.kvfiles.has("c")


def test_the_disk_budget_keeps_the_most_recently_written_files(host, clock):
    sweeps = sweeps_for(host)
    for name in ("a", "b", "c"):
        host.open(name, with_file=True)
        clock.advance(10)
    host.lifecycle.states.clear()
    host.change(disk_budget_bytes=host.kvfiles.total_bytes() * 7 // 10)
    sweeps.eviction_sweep()
    assert host.kvfiles.total_bytes() <= host.settings.disk_budget_bytes
    assert not host.kvfiles.has("a") and host.kvfiles.has("c")


def test_the_model_unloads_only_after_a_whole_idle_period(host, clock):
    sweeps = sweeps_for(host)
    clock.advance(59)
    assert sweeps.idle_check() is False and host.model_loaded
    clock.advance(1)
    assert sweeps.idle_check() is True and not host.model_loaded
    assert sweeps.idle_check() is False                        # nothing left to unload
    host.change(model_idle_unload_s=0)                         # 0: never
    host.model_loaded = True
    clock.advance(10**6)
    assert sweeps.idle_check() is False and host.model_loaded


def test_keepalive_rewarms_the_prefix_and_refreshes_only_stale_files(host, clock):
    sweeps = sweeps_for(host)
    fresh, stale = host.open("fresh"), host.open("stale")
    clock.advance(host.settings.ttl_short_s)                   # past 80 % of the short TTL
    fresh.last_used = clock()
    before = {name: host.file_time(name) for name in ("fresh", "stale")}
    sweeps.keepalive_sweep()
    after = {name: host.file_time(name) for name in ("fresh", "stale")}
    assert host.prefix_warmed == 1
    assert after["stale"] > before["stale"] and after["fresh"] == before["fresh"]
    assert stale.last_used < fresh.last_used
    host.model_loaded = False
    sweeps.keepalive_sweep()
    assert host.prefix_warmed == 1                             # unloaded: nothing to keep warm


def test_a_changed_interval_reschedules_its_job_and_a_shut_down_sweeper_hears_no_more(host):
    scheduler = ManualScheduler()
    sweeps = Sweeps(host, scheduler=scheduler)
    assert scheduler.intervals == {"keepalive": 240, "eviction": 300, "model_idle": 15}
    host.change(keepalive_interval_s=30, model_idle_unload_s=400)
    assert scheduler.intervals == {"keepalive": 30, "eviction": 300, "model_idle": 60}
    host.change(temperature=0.1)                               # not a field the sweeps read: nothing rescheduled
    scheduler.intervals.clear()
    host.change(top_k=7)
    assert scheduler.intervals == {}
    sweeps.shutdown()
    host.change(eviction_interval_s=10)
    assert scheduler.intervals == {}
    assert host.settings_hub.subscribers("eviction_interval_s") == 0
