"""The sweeps on an APScheduler 3 scheduler: keep-alive, eviction (idle, TTL, disk budget), model unload.

Invariants: a job never touches llama.cpp itself; it only queues work on the engine thread at
background priority, so sweeps never run beside a decode. Works headless (BackgroundScheduler)
or in the Qt event loop (the app passes a QtScheduler; this module imports no Qt). The sweeps see the
engine only as a `SweepHost`: the few things they read and call; the jobs follow their interval settings
through a `SettingsHub` subscription, cancelled by `shutdown`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from .events import EngineEvent, EventKind
from .worker import BACKGROUND, Command

if TYPE_CHECKING:
    from .conversations.lifecycle import ConversationLifecycle
    from .settings import Settings
    from .settings_hub import SettingsHub
    from .store.kvfiles import KVFileStore
    from .worker import EngineThread

log = logging.getLogger(__name__)
KEEPALIVE_STALE_FRACTION = 0.8
SCHEDULE_SETTINGS = ("keepalive_interval_s", "eviction_interval_s", "model_idle_unload_s")   # what `schedule` reads


class SweepHost(Protocol):
    """What the sweeps use of the engine. `thread` and `settings` are read from the scheduler's thread (to queue
    a sweep and to size the jobs); everything else only inside a sweep, on the engine thread."""

    settings: Settings                    # the settings now (a frozen snapshot)
    settings_hub: SettingsHub             # subscribed to for the jobs' intervals
    thread: EngineThread
    lifecycle: ConversationLifecycle      # the open conversations: `open_states`, `release`
    kvfiles: KVFileStore | None           # the KV files (they outlive the model)
    focused: str | None
    last_activity: float

    @property
    def model_loaded(self) -> bool: ...
    def clock(self) -> float: ...
    def warm_default_prefix(self) -> object: ...
    def unload_model(self, reason: str = "idle") -> None: ...
    def emit(self, event: EngineEvent) -> None: ...


class Sweeps:
    def __init__(self, engine: SweepHost, scheduler=None) -> None:
        self.engine = engine
        self.scheduler = scheduler if scheduler is not None else BackgroundScheduler(daemon=True)
        self.runs: dict[str, int] = {"keepalive": 0, "eviction": 0, "model_idle": 0}
        self.schedule()
        self._subscription = engine.settings_hub.subscribe(lambda old, new: self.schedule(),
                                                           fields=SCHEDULE_SETTINGS)
        if not self.scheduler.running:
            self.scheduler.start()

    def schedule(self) -> None:
        """(Re)create the jobs from the engine's current settings."""
        s = self.engine.settings
        jobs = {"keepalive": (self._queue_keepalive, s.keepalive_interval_s),
                "eviction": (self._queue_eviction, s.eviction_interval_s)}
        if s.model_idle_unload_s > 0:
            jobs["model_idle"] = (self._queue_idle_check, max(1, min(60, s.model_idle_unload_s // 4)))
        elif self.scheduler.get_job("model_idle"):
            self.scheduler.remove_job("model_idle")
        for job_id, (fn, seconds) in jobs.items():
            self.scheduler.add_job(fn, "interval", seconds=seconds, id=job_id, replace_existing=True,
                                   coalesce=True, max_instances=1)

    def jobs(self) -> list[dict]:
        return [{"id": job.id, "next_run": job.next_run_time, "interval_s": job.trigger.interval.total_seconds(),
                 "runs": self.runs.get(job.id, 0)} for job in self.scheduler.get_jobs()]

    # -- jobs: queue on the engine thread, never wait ---------------------------------------
    def _queue_keepalive(self) -> None:
        self.engine.thread.submit(self.keepalive_sweep, priority=BACKGROUND, command=Command.SWEEP)

    def _queue_eviction(self) -> None:
        self.engine.thread.submit(self.eviction_sweep, priority=BACKGROUND, command=Command.SWEEP)

    def _queue_idle_check(self) -> None:
        self.engine.thread.submit(self.idle_check, priority=BACKGROUND, command=Command.SWEEP)

    # -- the sweeps (engine thread) -----------------------------------------------------------
    def keepalive_sweep(self) -> None:
        """Re-warm the default prefix if it was dropped; keep open conversations' files fresh."""
        self.runs["keepalive"] += 1
        eng = self.engine
        if not eng.model_loaded:
            return
        eng.warm_default_prefix()
        now = eng.clock()
        stale_after = eng.settings.ttl_short_s * KEEPALIVE_STALE_FRACTION
        for state in eng.lifecycle.open_states():
            if now - state.last_used >= stale_after and eng.kvfiles.has(state.id):
                eng.kvfiles.touch(state.id)

    def eviction_sweep(self) -> list[str]:
        """Persist and release conversations idle past their TTL; delete expired files; cap the disk."""
        self.runs["eviction"] += 1
        eng = self.engine
        released = []
        if eng.model_loaded:
            now = eng.clock()
            ttl = eng.kvfiles.ttl_seconds             # one source of truth with the files' own expiry
            focused = eng.focused
            for state in eng.lifecycle.open_states():
                if state.id != focused and now - state.last_used > ttl[state.ttl_class]:
                    eng.lifecycle.release(state)
                    released.append(state.id)
                    eng.emit(EngineEvent(EventKind.RELEASED, "idle conversation saved to disk and released",
                                         conversation_id=state.id))
        if eng.kvfiles is not None:
            eng.kvfiles.sweep_expired(all_models=True)
            eng.kvfiles.enforce_disk_budget(eng.settings.disk_budget_bytes)
        return released

    def idle_check(self) -> bool:
        """Unload the model after `model_idle_unload_s` without a message (0 = never)."""
        self.runs["model_idle"] += 1
        eng = self.engine
        limit = eng.settings.model_idle_unload_s
        if limit > 0 and eng.model_loaded and eng.clock() - eng.last_activity >= limit:
            eng.unload_model()
            return True
        return False

    def shutdown(self) -> None:
        self._subscription.cancel()
        try:
            if self.scheduler.running:
                self.scheduler.shutdown(wait=False)
        except Exception:  # noqa: BLE001 - a Qt scheduler may already be gone with its loop
            log.debug("scheduler shutdown", exc_info=True)
