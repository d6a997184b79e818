"""The engine thread: one thread runs every job that touches llama.cpp, in priority order, each a typed command.

Invariants: jobs run one at a time, lower priority value first, FIFO within a priority; a job submitted after
`stop` fails its future instead of being lost silently. Every job is a `Job` (an id that only grows, its `Command`,
the conversation it is about, its priority), which its future carries as `future.job`; `jobs()` lists those queued
and the one running, and each job's start and end are logged at DEBUG with its id and how long it waited and ran,
so a request can be followed to the KV; `cancel(id)` drops a queued job (its future cancelled) and tells a
running one through the hook it was given (`on_cancel`).
"""

from __future__ import annotations

import enum
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
FOREGROUND, NORMAL, BACKGROUND = 0, 10, 20


class Command(enum.StrEnum):
    """What a job does, as the engine's public API names it."""
    LOAD = "load"                    # load, reload or unload the model; apply settings
    OPEN = "open"                    # open, create, release or persist a conversation's KV
    TURN = "turn"                    # a user or tool turn
    REGENERATE = "regenerate"
    CONTINUE = "continue"
    EDIT = "edit"                    # edit, truncate, fork, switch a version, delete a message
    COMPLETE = "complete"            # a stateless raw completion
    EMBED = "embed"                  # embedding work on idle time (drafts, warm-up, a turn's vectors)
    PREPARE = "prepare"              # a typed draft's input and recovery worked out ahead of its turn
    SWEEP = "sweep"                  # the scheduler's keep-alive, eviction and idle sweeps
    READ = "read"                    # a read of engine state (stats, blocks, tokens)
    WRITE = "write"                  # a change of metadata (title, pin, focus, budget)


@dataclass(frozen=True)
class Job:
    id: int
    command: Command
    conversation_id: str | None
    priority: int
    queued_at: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        about = f" {self.conversation_id}" if self.conversation_id else ""
        return f"job {self.id} {self.command}{about}"


class EngineThread:
    def __init__(self, name: str = "evoke-engine") -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._ids = itertools.count(1)
        self._stopped = False
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[Job, Future]] = {}
        self._cancel_hooks: dict[int, Callable[[], None]] = {}
        self.running: Job | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, priority: int = NORMAL, command: Command = Command.READ,
               about: str | None = None, on_cancel: Callable[[], None] | None = None, **kwargs: Any) -> Future:
        """Queue `fn(*args, **kwargs)` as a `command` job about conversation `about`; its future carries the
        `Job` (`future.job`). `on_cancel` is how `cancel(id)` stops it once it runs."""
        future: Future = Future()
        job = Job(next(self._ids), Command(command), about, priority)
        future.job = job
        if self._stopped:
            future.set_exception(RuntimeError("the engine is closed"))
            return future
        with self._lock:
            self._waiting[job.id] = (job, future)
            if on_cancel is not None:
                self._cancel_hooks[job.id] = on_cancel
        self._queue.put((priority, next(self._order), job, fn, args, kwargs, future))
        return future

    def call(self, fn: Callable[..., Any], *args: Any, priority: int = NORMAL, command: Command = Command.READ,
             about: str | None = None, **kwargs: Any) -> Any:
        """Run `fn` on the engine thread and wait (runs inline when already on it)."""
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, priority=priority, command=command, about=about, **kwargs).result()

    def pending(self) -> int:
        """Jobs queued and not yet started (approximate while other threads submit)."""
        return self._queue.qsize()

    def jobs(self) -> list[Job]:
        """The job running (first) and those queued, in the order they will run."""
        with self._lock:
            queued = sorted((job for job, _ in self._waiting.values() if job is not self.running),
                            key=lambda j: (j.priority, j.id))
            return [*([self.running] if self.running is not None else []), *queued]

    def cancel(self, job_id: int) -> bool:
        """Drop a queued job or stop a running one (through its `on_cancel`); False when it is unknown or done."""
        with self._lock:
            entry = self._waiting.get(job_id)
            hook = self._cancel_hooks.get(job_id)
        if entry is None:
            return False
        job, future = entry
        if future.cancel():
            log.debug("%s cancelled before it ran", job.describe())
            return True
        if hook is not None:
            hook()
            return True
        return False

    def _run(self) -> None:
        while True:
            _, _, job, fn, args, kwargs, future = self._queue.get()
            if fn is None:
                break
            if not future.set_running_or_notify_cancel():
                self._forget(job)
                continue
            self.running = job
            started = time.monotonic()
            log.debug("%s started after %.1f ms queued", job.describe(), (started - job.queued_at) * 1000)
            result, failure = None, None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                failure = exc
            self.running = None
            self._forget(job)
            log.debug("%s %s in %.1f ms", job.describe(), "failed" if failure else "ended",
                      (time.monotonic() - started) * 1000)
            if failure is not None:
                future.set_exception(failure)
            else:
                future.set_result(result)

    def _forget(self, job: Job) -> None:
        with self._lock:
            self._waiting.pop(job.id, None)
            self._cancel_hooks.pop(job.id, None)

    def stop(self, timeout: float | None = 30) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._queue.put((10**9, next(self._order), None, None, (), {}, None))
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)
