"""A streamed turn's start, shared by the chat and responses routes: the 200 acknowledges a stored message.

Invariants: returns once the turn's message is in SQLite, or at once when the turn is queued behind other replies
(its client is told its place instead of being kept without an answer); a turn that failed before its message was
stored raises its error here, before any header; a client that leaves meanwhile cancels the turn.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request

from .service import ChatService, Prepared, cancel_on_disconnect

QUEUED_PING_S = 1.0          # while the reply waits for its turn to start: ": queued N" this often


async def start_stored(service: ChatService, prepared: Prepared, http: Request, pieces: asyncio.Queue,
                       loop: asyncio.AbstractEventLoop, ended: object) -> None:
    """Submit the prepared turn: its pieces, then `ended`, go to `pieces`. A storage failure after a queued start
    comes as the stream's error event instead (the turn's future holds it)."""
    stored = asyncio.Event()

    def acknowledge() -> None:
        prepared.acknowledged = True
        stored.set()
    future = service.submit(prepared, on_token=lambda p: loop.call_soon_threadsafe(pieces.put_nowait, p),
                            on_stored=lambda: loop.call_soon_threadsafe(acknowledge))
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, ended))
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(stored.set))
    watcher = asyncio.create_task(cancel_on_disconnect(http, prepared.future, prepared.conv.cancel))
    try:
        while not stored.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stored.wait(), QUEUED_PING_S)
            if not stored.is_set() and service.engine.queue_position(future.job.id):
                break                                      # queued behind other replies: the response begins now
    except asyncio.CancelledError:
        prepared.conv.cancel()
        raise
    finally:
        watcher.cancel()
    if not prepared.acknowledged and future.done() and not future.cancelled() and future.exception() is not None:
        raise future.exception()
