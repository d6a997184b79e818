"""The engine thread: one scheduler runs every job that touches llama.cpp, in priority order, each a typed command;
replies (turns, regenerations, continues) are *streams* that take turns with each other and with other jobs.

Invariants: exactly one job touches llama.cpp at a time. A plain job runs to its end on the scheduler's thread. A
stream runs on a thread of its own that holds the engine only while the scheduler has handed it over, and hands it
back at each step boundary (`step_boundary`: between prefill chunks, between reply tokens), where its conversation's
memory is consistent; so a second reply's first token waits for one step, not for a whole reply. The next step goes
to the stream with the least engine time for its weight (the window's counts double), so a long prefill's steps
never starve a reply that is decoding. Where the engine installs a `shared_step` (one context for every slot), a
reply's next token parks (`await_step`) and the parked replies' tokens run in one decode once every other reply has
taken its step of the round; nothing else runs between that decode and their samples. A job about a
conversation whose reply is streaming waits until that reply ends (nothing edits, opens or releases a conversation
mid-reply); LOAD, SWEEP and DRAIN jobs wait until no reply streams; at most `stream_limit()` replies stream at once, the
rest wait in order, except the window's: where the limit is reached it suspends the newest endpoint reply (no step
until no window reply streams; its cells stay) and starts at once; a raw completion streams past the limit, one at a
time. Lower priority value first, FIFO within a priority; a job submitted after `stop` fails its
future instead of being lost silently. Every job is a `Job` (an id that only grows, its `Command`, the conversation
it is about, its priority), which its future carries as `future.job`; `jobs()` lists those running and queued, and
each job's start and end are logged at DEBUG with its id and how long it waited and ran, so a request can be
followed to the KV; `cancel(id)` drops a queued job (its future cancelled) and tells a running one through the hook
it was given (`on_cancel`), which a stream sees at its next step.
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
FOREGROUND, LATENCY, NORMAL, BACKGROUND = 0, 5, 10, 20   # LATENCY: raw completions (an editor's, a FIM)


class Command(enum.StrEnum):
    """What a job does, as the engine's public API names it."""
    LOAD = "load"                    # load, reload or unload the model; apply settings
    OPEN = "open"                    # open, create, release or persist a conversation's KV
    REBUILD = "rebuild"              # open a conversation whose KV may be rebuilt from history: a stream, whose
                                     # prefill chunks take turns with replies (an endpoint import, a background open)
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
    DRAIN = "drain"                  # nothing: it runs once every reply has ended (`Engine.wait_idle`)


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


STREAM_COMMANDS = frozenset({Command.TURN, Command.REGENERATE, Command.CONTINUE, Command.REBUILD, Command.COMPLETE})
# streams with one sequence of their own each, one at a time, admitted past `stream_limit` (short, latency-bound)
SOLO_STREAMS = frozenset({Command.COMPLETE})
# work that means a request or a user is at another conversation (reads, sweeps and idle embedding do not)
ARRIVALS = frozenset({*STREAM_COMMANDS, Command.OPEN, Command.EDIT, Command.COMPLETE, Command.PREPARE})
ARRIVAL_GRACE_S = 1.0
EXCLUSIVE_COMMANDS = frozenset({Command.LOAD, Command.SWEEP, Command.DRAIN})   # run only while no reply streams
_STOP = 10**9                                                   # the stop marker's priority: after every job
FOREGROUND_WEIGHT = 2.0        # the window's reply (and a raw completion) gets twice an endpoint reply's engine time
START_CREDIT_S = 0.3           # engine time a new stream takes uncharged until its first token (its set-up and a short
                               # prompt's prefill), a step in turn with the others: its first token does not wait for
                               # their fair share, nor do they wait for its set-up
PREFILL_COST = 2.0             # past its start credit, a stream's engine time before its first token (a long prompt's
                               # prefill) counts this many times: the replies decoding beside a long paste keep about
                               # two thirds of the engine, not half (a decoding reply before a waiting prompt)
PREFILL_STEP_SHARE = 1.5       # a prefill step beside decoding replies takes about this many of their token steps
                               # (`prefill_tokens_per_step`): a decoding reply's gap stays under three token steps


@dataclass(order=True)
class _Entry:
    """A queued job as the scheduler orders it: by priority, then by submission."""
    priority: int
    order: int
    job: Job | None = field(compare=False)                      # None: the stop marker
    fn: Callable[..., Any] | None = field(compare=False, default=None)
    args: tuple = field(compare=False, default=())
    kwargs: dict = field(compare=False, default_factory=dict)
    future: Future | None = field(compare=False, default=None)


class _Stream:
    """A reply on a thread of its own that runs only between `resume` (scheduler) and its next `pause` (itself,
    at a step boundary) or its end: the engine is handed back and forth, never held by two threads."""

    def __init__(self, entry: _Entry, name: str, local: threading.local, clock: Callable[[], float]) -> None:
        self.entry = entry
        self._clock = clock
        self.result: Any = None
        self.failure: BaseException | None = None
        self.done = False
        self.steps = 0
        self.used_s = 0.0                             # engine time taken, divided by its weight (fair share)
        self.weight = FOREGROUND_WEIGHT if entry.priority <= LATENCY else 1.0
        self.parked = False                           # its next token waits for the shared step
        self.suspended = False                        # preempted for the window's reply: takes no step until it ends
        self.credit_s = START_CREDIT_S                # uncharged engine time left before its first token
        self.first_token = False                      # it has reached its first reply token
        self.cadence_from = 0                         # jobs submitted up to its first token (ids <= this) came before
                                                      # its tokens' cadence did: their prefill is no gap of its
        self.stepped_in = -1                          # the shared-step round it last took a step in
        self.resumed_at: float | None = None          # when its running step began (None between steps)
        self.step_failure: BaseException | None = None    # the shared step it waited for failed with this
        self._go = threading.Semaphore(0)
        self._back = threading.Semaphore(0)
        self._local = local
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    @property
    def starting(self) -> bool:
        """Its start credit applies: no first token yet, credit left."""
        return not self.first_token and self.credit_s > 0

    @property
    def job(self) -> Job:
        assert self.entry.job is not None
        return self.entry.job

    def _main(self) -> None:
        self._go.acquire()
        self._local.stream = self
        entry = self.entry
        try:
            assert entry.fn is not None
            self.result = entry.fn(*entry.args, **entry.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.failure = exc
        finally:
            self.done = True
            self._back.release()

    def resume(self) -> None:
        """Scheduler side: let the stream run one step (or to its end) and wait until it hands the engine back."""
        self.steps += 1
        started = self.resumed_at = self._clock()
        self._go.release()
        self._back.acquire()
        took = self._clock() - started
        if self.starting:                                 # a new reply's set-up and short prefill: not charged
            free = min(took, self.credit_s)
            self.credit_s -= free
            took -= free
        if not self.first_token:
            took *= PREFILL_COST
        self.resumed_at = None
        self.used_s += took / self.weight

    def pause(self) -> None:
        """Stream side, at a step boundary: hand the engine back and wait for the next turn."""
        self._back.release()
        self._go.acquire()


class EngineThread:
    def __init__(self, name: str = "evoke-engine", *, stream_limit: Callable[[], int] = lambda: 1,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.name = name
        self.clock = clock                           # what a stream's engine time is measured with
        self.stream_limit = stream_limit             # how many replies may stream at once (read at each admission)
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._ready: list[_Entry] = []               # taken from the queue, not started yet (some wait on a stream)
        self._streams: list[_Stream] = []            # replies streaming, in the order they started
        self._local = threading.local()
        self._order = itertools.count()
        self._ids = itertools.count(1)
        self._stream_names = itertools.count(1)
        self._stopped = False
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[Job, Future]] = {}
        self._cancel_hooks: dict[int, Callable[[], None]] = {}
        self.running: Job | None = None              # the plain job running on the scheduler's thread
        self._arrived: dict[str, float] = {}         # conversation -> when work about it last arrived (`contended`)
        self._last_job_id = 0                        # the newest job submitted (a stream's `cadence_from`)
        # runs the step the parked replies share (their tokens in one decode; `Runtime.run_step`), installed by the
        # engine with the model; None: every reply decodes alone
        self.shared_step: Callable[[], None] | None = None
        self._round = 0                              # shared steps run: each reply takes one step a round
        self._last_advanced: _Stream | None = None   # the stream that took the last step
        self._last_step_s = 0.0                      # how long the last shared step took
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
            self._last_job_id = max(self._last_job_id, job.id)
            if about is not None and job.command in ARRIVALS:
                self._arrived[about] = self.clock()
                if len(self._arrived) > 64:                  # old arrivals say nothing: the map stays small
                    self._arrived = dict(sorted(self._arrived.items(), key=lambda kv: kv[1])[-32:])
            if on_cancel is not None:
                self._cancel_hooks[job.id] = on_cancel
        self._queue.put(_Entry(priority, next(self._order), job, fn, args, kwargs, future))
        return future

    def on_engine(self) -> bool:
        """The calling thread holds the engine: the scheduler's own, or a stream's while it runs."""
        return threading.current_thread() is self.thread or getattr(self._local, "stream", None) is not None

    def call(self, fn: Callable[..., Any], *args: Any, priority: int = NORMAL, command: Command = Command.READ,
             about: str | None = None, **kwargs: Any) -> Any:
        """Run `fn` on the engine thread and wait (runs inline when the caller already holds the engine)."""
        if self.on_engine():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, priority=priority, command=command, about=about, **kwargs).result()

    def step_boundary(self) -> None:
        """Called by a reply between two of its steps: other replies and jobs may run now. A no-op outside a
        stream, and when nothing else could run."""
        stream = getattr(self._local, "stream", None)
        if stream is None or (len(self._streams) == 1 and self._queue.empty() and self._pick() is None):
            return
        stream.pause()

    def token_boundary(self) -> None:
        """Called by a reply before decoding its next token (the one it just sampled): its first token is out, so
        its start credit ends; then a step boundary."""
        stream = getattr(self._local, "stream", None)
        if stream is not None:
            self._reached_first_token(stream)
        self.step_boundary()

    def _reached_first_token(self, stream: _Stream) -> None:
        """A stream's first token is out: from here it shares the engine as a decoding reply. Engine time its start
        credit left uncharged is no claim on the others' steps: it goes on level with the least-served of them (else
        the reply it cut in beside would wait until the newcomer's charged time caught up with its own)."""
        if stream.first_token:
            return
        stream.first_token = True
        stream.cadence_from = self._last_job_id
        others = [s.used_s for s in self._streams if s is not stream and not s.suspended]
        if others:
            stream.used_s = max(stream.used_s, min(others))

    def boundary_if_spent(self, token_step_s: float | None) -> None:
        """A step boundary only where the running step has taken a token step's time already (`token_step_s`, the
        runtime's measure; None: always): a reply's quick set-up goes on into its first prefill chunk."""
        stream = getattr(self._local, "stream", None)
        if stream is None or stream.resumed_at is None:
            return
        if token_step_s is None or self.clock() - stream.resumed_at >= token_step_s:
            self.step_boundary()

    def prefill_tokens_per_step(self, prompt_token_s: float | None, token_step_s: float | None, cap: int) -> int:
        """How many prompt tokens the calling stream's prefill step beside decoding replies takes: `PREFILL_STEP_SHARE`
        token steps' worth (`token_step_s`) at `prompt_token_s` a token (the runtime's measures), at least 1 and at
        most `cap`; `cap` until both are measured, where no other reply is decoding (other work waiting, or other
        prompts prefilling, is served a step at a time by the boundaries alone), while the stream is within its start
        credit and every decoding reply's first token came after it was submitted (requests sent together start
        together, as llama-server's slots do: a cadence not yet begun has no gap to keep; a long paste sent with them
        is chunked again once its credit is spent), and for a stream that goes before every other streaming one (the
        window's turn beside endpoint replies, a raw completion beside chats): their smoothness does not slow it."""
        stream = getattr(self._local, "stream", None)
        others = [other for other in self._streams if other is not stream and not other.suspended]
        shielded = stream.job.id if stream is not None and stream.starting else None   # sent with them, if before
        if not any(other.first_token and (shielded is None or shielded > other.cadence_from) for other in others):
            return cap
        if stream is not None and all(stream.entry.priority < other.entry.priority for other in others):
            return cap
        if not prompt_token_s or not token_step_s:
            return cap
        return max(1, min(cap, int(PREFILL_STEP_SHARE * token_step_s / prompt_token_s)))

    def joins_step(self) -> bool:
        """Called by a reply about to decode its next token: True when the token should wait for the step other
        replies share (another reply streams and the engine can run one), then `await_step`."""
        stream = getattr(self._local, "stream", None)
        return (stream is not None and self.shared_step is not None
                and any(other is not stream for other in self._streams))

    def await_step(self) -> None:
        """Stream side: park until the shared step has decoded this reply's token (and sampled its next); other
        replies take their steps meanwhile. Raises what the shared step failed with."""
        stream = self._local.stream
        stream.parked = True
        self._reached_first_token(stream)
        stream.pause()
        failure, stream.step_failure = stream.step_failure, None
        if failure is not None:
            raise failure

    def pending(self) -> int:
        """Jobs queued and not yet started (approximate while other threads submit)."""
        return self._queue.qsize() + len(self._ready)

    def contended(self) -> bool:
        """Other work waits for the engine besides the running reply, or work about another conversation arrived
        within `ARRIVAL_GRACE_S` (a request's next job comes a few milliseconds after its first ends): the running
        reply's long decodes are then split in steps."""
        if len(self._streams) > 1 or not self._queue.empty():
            return True
        stream = getattr(self._local, "stream", None)
        mine = stream.job.conversation_id if stream is not None else None
        now = self.clock()
        return any(now - at < ARRIVAL_GRACE_S for about, at in list(self._arrived.items()) if about != mine)

    def streaming(self) -> list[Job]:
        """The replies streaming now, in the order they take steps."""
        return [s.job for s in list(self._streams)]

    def reply_counts(self) -> tuple[int, int]:
        """(replies streaming now, replies queued for their turn to start): the endpoint's gauges."""
        with self._lock:
            queued = sum(1 for job, future in self._waiting.values()
                         if job.command in STREAM_COMMANDS and not future.running() and not future.done())
        return len(self._streams), queued

    def queue_position(self, job_id: int) -> int | None:
        """0 while job `job_id` runs (a plain job or a streaming reply); N when N-1 replies queued ahead of it start
        first (replies start in priority order, then in order of submission); None when it is unknown or done."""
        with self._lock:
            entry = self._waiting.get(job_id)
            if entry is None:
                return None
            job, future = entry
            if future.running():
                return 0
            ahead = sum(1 for other, f in self._waiting.values()
                        if other.command in STREAM_COMMANDS and not f.running() and not f.done()
                        and (other.priority, other.id) < (job.priority, job.id))
        return ahead + 1

    def streaming_conversations(self) -> set[str]:
        """The conversations whose reply streams now."""
        return {job.conversation_id for job in self.streaming() if job.conversation_id}

    def jobs(self) -> list[Job]:
        """The jobs running (first: the plain job, then the streams) and those queued, in the order they will run."""
        with self._lock:
            running = [*([self.running] if self.running is not None else []), *self.streaming()]
            queued = sorted((job for job, _ in self._waiting.values() if job not in running),
                            key=lambda j: (j.priority, j.id))
            return [*running, *queued]

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

    # -- the scheduler ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._take_queued(block=not self._streams and not self._ready)
            entry = self._pick()
            if entry is not None:
                self._ready.remove(entry)
                if entry.job is None:                # the stop marker: every job before it has run
                    break
                if self._start(entry):               # a reply started: its first step was this turn's
                    continue
            elif not self._streams:                  # nothing can run: wait for a submission
                self._take_queued(block=True)
                continue
            self._step_one_stream()

    def _take_queued(self, *, block: bool) -> None:
        try:
            if block:
                self._ready.append(self._queue.get())
            while True:
                self._ready.append(self._queue.get_nowait())
        except queue.Empty:
            pass

    def _pick(self) -> _Entry | None:
        """The first ready job that may start now (see the module's invariants), or None."""
        busy = {s.job.conversation_id for s in self._streams}
        for entry in sorted(self._ready):
            job = entry.job
            if job is None:
                if not self._streams and len(self._ready) == 1:
                    return entry
                continue
            if entry.future is not None and entry.future.cancelled():
                return entry                          # dropped at once by `_start`
            if job.conversation_id is not None and job.conversation_id in busy:
                continue
            if self._streams and job.command in EXCLUSIVE_COMMANDS:
                continue
            if job.command in SOLO_STREAMS:
                if any(s.job.command is job.command for s in self._streams):
                    continue
            elif (job.command in STREAM_COMMANDS and self._replies() >= max(1, self.stream_limit())
                  and (entry.priority > FOREGROUND or not self._preempt_for(job))):
                continue
            return entry
        return None

    def _preempt_for(self, job: Job) -> bool:
        """Suspend the newest endpoint reply so the window's reply `job` streams now instead of waiting for one to
        end: the suspended reply keeps its slot, its cells and its place (a pause its client sees, never an error)
        and takes steps again once no window reply streams. False when every stream is the window's."""
        victims = [s for s in self._streams
                   if not s.suspended and s.entry.priority > FOREGROUND and s.job.command not in SOLO_STREAMS]
        if not victims:
            return False
        victim = max(reversed(victims), key=lambda s: s.entry.priority)
        victim.suspended = True
        log.debug("%s suspended for %s", victim.job.describe(), job.describe())
        return True

    def suspended(self) -> list[Job]:
        """The replies preempted for the window's reply (they resume when it ends)."""
        return [s.job for s in list(self._streams) if s.suspended]

    def _replies(self) -> int:
        """Streams that count against `stream_limit` (a raw completion does not: one at a time, past the limit; nor
        does a reply suspended for the window's)."""
        return sum(1 for s in self._streams if s.job.command not in SOLO_STREAMS and not s.suspended)

    def _start(self, entry: _Entry) -> bool:
        """Run a plain job to its end, or start a stream and run its first step (True)."""
        job, future = entry.job, entry.future
        assert job is not None and future is not None
        if not future.set_running_or_notify_cancel():
            self._forget(job)
            return False
        future.waited_s = time.monotonic() - job.queued_at       # the request's queue wait (its usage figures)
        log.debug("%s started after %.1f ms queued", job.describe(), future.waited_s * 1000)
        if job.command in STREAM_COMMANDS:
            stream = _Stream(entry, f"{self.name}-stream-{next(self._stream_names)}", self._local, self.clock)
            stream.used_s = min((s.used_s for s in self._streams), default=0.0)   # no credit for having waited
            self._streams.append(stream)
            self._advance(stream)                     # its first step now: a reply starts without a round's wait
            return True
        self.running = job
        started = time.monotonic()
        result, failure = None, None
        try:
            assert entry.fn is not None
            result = entry.fn(*entry.args, **entry.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure = exc
        self.running = None
        self._settle(job, future, result, failure, started)
        return False

    def _step_one_stream(self) -> None:
        """One step for the stream that has had the least engine time for its weight (the newest on a tie: a new
        reply's first token comes soonest): a reply's token is not held back by another's long prefill steps, and
        short steps take turns. With replies parked for the shared step, each other reply takes one step first (a
        prefill chunk, a reply's set-up), then the step runs: a round is one step of each."""
        if not self._streams:
            return
        if any(s.suspended for s in self._streams) and not any(
                s.entry.priority <= FOREGROUND for s in self._streams if not s.suspended):
            going = [s.used_s for s in self._streams if not s.suspended]
            for stream in self._streams:                 # no window reply streams: the preempted go on, with no
                if stream.suspended:                     # credit for the pause (it would hold the others back)
                    stream.suspended = False
                    stream.used_s = max(stream.used_s, min(going, default=stream.used_s))
        newest_first = list(reversed(self._streams))
        parked = [s for s in newest_first if s.parked]
        stepping = [s for s in newest_first if not s.suspended]
        if not parked:
            last = self._last_advanced
            if last is not None and last.starting and len(stepping) > 1:     # a starting stream steps in turn
                stepping = [s for s in stepping if s is not last]
            self._advance(min(stepping, key=lambda s: s.used_s))
            return
        # a stream that is not parked takes one step a round while it is not ahead of the parked replies' engine time
        # by more than a shared step (a long prefill's costly chunks do not each buy the parked replies one token)
        ahead = max(s.used_s for s in parked) + max(self._last_step_s, 0.01)
        due = [s for s in stepping if not s.parked and s.stepped_in < self._round and s.used_s <= ahead]
        if due:
            self._advance(min(due, key=lambda s: s.used_s))
        else:
            self._run_shared_step(parked)

    def _run_shared_step(self, parked: list[_Stream]) -> None:
        """The parked replies' tokens in one decode, on the scheduler's thread while they wait; its time is shared
        among them for the fair share."""
        assert self.shared_step is not None
        started = self.clock()
        try:
            self.shared_step()
        except BaseException as exc:  # noqa: BLE001 - each waiting reply raises it in its own thread
            for stream in parked:
                stream.step_failure = exc
        self._last_step_s = self.clock() - started
        share = self._last_step_s / len(parked)
        self._round += 1
        for stream in parked:
            stream.parked = False
            stream.used_s += share / stream.weight

    def _advance(self, stream: _Stream) -> None:
        stream.stepped_in = self._round
        self._last_advanced = stream
        stream.resume()
        if stream.done:
            self._streams.remove(stream)
            assert stream.entry.future is not None
            self._settle(stream.job, stream.entry.future, stream.result, stream.failure,
                         stream.job.queued_at, steps=stream.steps)

    def _settle(self, job: Job, future: Future, result: Any, failure: BaseException | None, started: float,
                steps: int = 0) -> None:
        self._forget(job)
        log.debug("%s %s in %.1f ms%s", job.describe(), "failed" if failure else "ended",
                  (time.monotonic() - started) * 1000, f" ({steps} steps)" if steps else "")
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
        self._queue.put(_Entry(_STOP, next(self._order), None))
        if not self.on_engine():
            self.thread.join(timeout)
