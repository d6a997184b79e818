"""The FastAPI application: `POST /v1/chat/completions` (SSE or JSON), `GET /v1/models`, `GET /health`.

Invariants: every engine call runs off the event loop (worker threads, the engine thread behind them);
a stream ends with `data: [DONE]`; a client that disconnects, streaming or not, cancels its generation, whose
partial reply the engine keeps; errors are OpenAI-shaped (`errors.py`); every response names the client's
token (`X-Evoke-Client`) when the server handed one out.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from anyio import to_thread
from fastapi import FastAPI, Header, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse

from ..engine import Engine
from ..errors import BudgetError, EvokeError
from .clients import CLIENT_HEADER, identify
from .errors import ApiError, install_handlers
from .models import ChatRequest, unpaired_surrogate
from .security import GuardMiddleware, ServerConfig
from .service import ChatService, Outcome, Prepared
from .toolcalls import StreamSplitter


def create_app(engine: Engine, config: ServerConfig | None = None, state_dir: Path | None = None) -> FastAPI:
    config = config or ServerConfig()
    service = ChatService(engine, state_dir or engine.settings.data_dir)
    app = FastAPI(title="Evoke Desk", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    install_handlers(app)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Evoke-Session", CLIENT_HEADER],
                           expose_headers=["X-Evoke-Session", "X-Evoke-Conversation", CLIENT_HEADER])
    app.add_middleware(GuardMiddleware, config=config)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model_loaded": engine.model_loaded}

    @app.get("/v1/models")
    async def models() -> dict:
        model_id = await to_thread.run_sync(service.model_id)
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0,
                                            "owned_by": "evoke-desk"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest, http: Request, x_evoke_session: str | None = Header(default=None),
                   x_evoke_client: str | None = Header(default=None)):
        surrogate = unpaired_surrogate(request.model_dump(exclude_none=True))
        if surrogate is not None:
            raise ApiError(400, f"{surrogate[0]}: a lone UTF-16 surrogate at character {surrogate[1]}; "
                                "text must be valid Unicode", "invalid_unicode", surrogate[0])
        client = identify(x_evoke_client, bool(config.api_key))
        model_id = await to_thread.run_sync(service.check_model, request.model)
        prepared = await service.prepare(request, x_evoke_session, client)
        headers = {"X-Evoke-Session": prepared.session or prepared.conv.id,
                   "X-Evoke-Conversation": prepared.conv.id}
        if client.issued:
            headers[CLIENT_HEADER] = client.issued
        loop = asyncio.get_running_loop()
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return StreamingResponse(_stream(service, prepared, model_id, include_usage, loop),
                                     media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        watcher = None
        try:
            future = service.submit(prepared)
            watcher = asyncio.create_task(_cancel_on_disconnect(http, prepared))
            reply = await asyncio.wrap_future(future)
            outcome = await to_thread.run_sync(service.finish, prepared, reply)
        except asyncio.CancelledError:
            prepared.conv.cancel()
            raise
        except BudgetError as exc:
            raise ApiError(400, str(exc), "context_length_exceeded") from exc
        except EvokeError as exc:
            raise ApiError(500, f"generation failed: {exc}", "engine_error") from exc
        finally:
            if watcher is not None:
                watcher.cancel()
            service.release(prepared, loop)
        return JSONResponse(_completion(model_id, outcome), headers=headers)

    return app


async def _cancel_on_disconnect(http: Request, prepared: Prepared, poll_s: float = 0.25) -> None:
    """Stop the generation of a non-streaming request whose client went away (the partial reply is kept)."""
    while prepared.future is not None and not prepared.future.done():
        if await http.is_disconnected():
            prepared.conv.cancel()
            return
        await asyncio.sleep(poll_s)


def _completion(model_id: str, outcome: Outcome) -> dict:
    message: dict = {"role": "assistant", "content": outcome.content}
    if outcome.tool_calls:
        message["tool_calls"] = outcome.tool_calls
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": model_id, "choices": [{"index": 0, "message": message, "finish_reason": outcome.finish_reason,
                                            "logprobs": None}],
            "usage": outcome.usage}


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def _stream(service: ChatService, prepared: Prepared, model_id: str, include_usage: bool,
                  loop: asyncio.AbstractEventLoop) -> AsyncIterator[str]:
    chunk_id, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

    def chunk(delta: dict, finish: str | None = None) -> str:
        return _sse({"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model_id,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    pieces: asyncio.Queue = asyncio.Queue()
    done = object()
    splitter = StreamSplitter(enabled=bool(prepared.tool_names))
    try:
        future = service.submit(prepared, on_token=lambda p: loop.call_soon_threadsafe(pieces.put_nowait, p))
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, done))
        yield chunk({"role": "assistant", "content": ""})
        while (piece := await pieces.get()) is not done:
            out = splitter.feed(piece)
            if out:
                yield chunk({"content": out})
        try:
            reply = future.result()
        except EvokeError as exc:
            yield _sse({"error": {"message": f"generation failed: {exc}", "type": "server_error",
                                  "code": "engine_error", "param": None}})
            yield _sse("[DONE]")
            return
        outcome = await to_thread.run_sync(service.finish, prepared, reply)
        if outcome.tool_calls:
            if outcome.content and splitter.sent == 0:
                yield chunk({"content": outcome.content})
            for index, call in enumerate(outcome.tool_calls):
                yield chunk({"tool_calls": [{"index": index, **call}]})
        elif splitter.unsent():
            yield chunk({"content": splitter.unsent()})
        yield chunk({}, outcome.finish_reason)
        if include_usage:
            yield _sse({"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model_id,
                        "choices": [], "usage": outcome.usage})
        yield _sse("[DONE]")
    finally:
        if prepared.future is not None and not prepared.future.done():
            prepared.conv.cancel()             # the client went away: stop, keep the partial reply
        service.release(prepared, loop)
