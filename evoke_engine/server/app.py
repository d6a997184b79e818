"""The FastAPI application: `POST /v1/chat/completions` (SSE or JSON), `POST /v1/completions` (`completions`),
`POST /v1/embeddings`, `GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics`.

Invariants: every engine call runs off the event loop (worker threads, the engine thread behind them); a stream ends
with `data: [DONE]`; a stream's 200 is sent only once its message is in SQLite, so a failure after it keeps the
message the 200 acknowledged, and one before it (a full disk) is an error response; a client that disconnects,
streaming or not, cancels its generation, whose partial reply the engine keeps; errors are OpenAI-shaped
(`errors.py`); every response names the client's token (`X-Evoke-Client`) when the server handed one out; `usage`
holds OpenAI's fields only (the tokens not decoded are `prompt_tokens_details.cached_tokens`), Evoke's own figures are
the top-level `evoke` object; a context overflow is OpenAI's `context_length_exceeded`, worded "maximum context length
is N tokens" as litellm recognises it. A storage failure (a full disk, a read-only or damaged database) is a 507
(full) or 503 that names no path (`storage_refusal`), wherever it surfaces. A request without `X-Evoke-Client` (and
without the API key) is its own throwaway client (`clients`): it never continues another's conversation by
re-sending its history; it is handed a token, and continues what it made only by sending that token back. A new
session name past its client's cap forgets that client's own least recently used name; past the sessions kept in
all it is a 503 (`too_many_sessions`), never made by forgetting another client's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from anyio import to_thread
from fastapi import FastAPI, Header, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from .. import DISK_FULL, Engine, GrammarError, StoreError
from ..errors import BudgetError, EvokeError
from .admission import AdmissionMiddleware
from .api_errors import ApiError, context_length, install_handlers, overflow
from .clients import CLIENT_HEADER, Client, identify
from .completions import add_completion_route
from .constraints import grammar_for
from .embeddings import EmbeddingLog, EmbeddingRequest, embed_request
from .llama_routes import add_llama_routes
from .metrics import Metrics
from .request_bodies import ChatRequest, check_body
from .responses_api import add_responses_routes
from .security import GuardMiddleware, ServerConfig
from .service import STATELESS, ChatService, Outcome, Prepared, cancel_on_disconnect
from .stored_start import QUEUED_PING_S, start_stored
from .toolcall_formats import loaded_format
from .toolcall_stream import CallReader, Delta

log = logging.getLogger(__name__)


def create_app(engine: Engine, config: ServerConfig | None = None, state_dir: Path | None = None) -> FastAPI:
    config = config or ServerConfig()
    service = ChatService(engine, state_dir or engine.settings.data_dir,
                          max_prefill_tokens=config.max_prefill_tokens)
    app = FastAPI(title="Evoke Desk", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    metrics = app.state.metrics = Metrics()
    embedding_log = app.state.embedding_log = EmbeddingLog()
    engine.subscribe(metrics.on_event)
    install_handlers(app)
    install_storage_handlers(app)
    service.sessions.max_per_owner = config.max_sessions_per_client
    service.sessions.max_sessions = config.max_sessions
    service.sessions.on_forget = lambda ids: forget_sessions(engine, ids)
    service.max_live_per_owner, service.max_live = config.max_live_per_client, config.max_live
    app.add_middleware(GuardMiddleware, config=config)
    app.add_middleware(AdmissionMiddleware, max_requests=config.max_connections,     # outside the body reader:
                       per_client=config.max_requests_per_client,                    # a trickling body holds a place
                       known=service.sessions.has_owner, api_key=config.api_key)
    if config.cors_origins:      # outermost: refusals (401, 403, 413, ...) carry the CORS headers too
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["*"],     # any request header (the openai-node SDK's x-stainless-*)
                           expose_headers=["X-Evoke-Session", "X-Evoke-Conversation", JOB_HEADER, QUEUE_HEADER,
                                           CLIENT_HEADER])

    @app.get("/health")
    async def health():
        """200 once the model has loaded (llama-server's contract); 503 with the reason while it loads or failed."""
        if not engine.ready.done():
            return JSONResponse({"status": "loading", "reason": "the model is loading"}, status_code=503)
        if engine.ready.exception() is not None:
            return JSONResponse({"status": "error", "reason": f"the model failed to load: {engine.ready.exception()}"},
                                status_code=503)
        return {"status": "ok", "model_loaded": engine.model_loaded}

    def model_card() -> dict:
        model_id, info, settings = service.model_id(), engine.model_info(), engine.settings
        length = context_length(engine)
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "evoke-desk",
                "context_length": length, "max_model_len": length, "max_context_length": length,
                "meta": {"n_ctx": length, "n_ctx_train": info.n_ctx_train, "budget_tokens": settings.budget_tokens,
                         "n_params": info.n_params, "size": info.size_bytes,
                         "tool_call_format": loaded_format(engine).name}}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [await to_thread.run_sync(model_card)]}

    @app.get("/v1/models/{model_name:path}")
    async def model(model_name: str) -> dict:
        await to_thread.run_sync(service.check_model, model_name)
        return await to_thread.run_sync(model_card)

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        def scrape() -> str:
            kvfiles, model = engine.kvfiles, engine.diagnostics()     # the pool's two ints read as they are,
            pool = model.pool if model is not None else None                       # not queued behind a turn
            streaming, waiting = engine.reply_counts()
            gauges = {"model_loaded": ("1 while the model is loaded", float(engine.model_loaded)),
                      "conversations": ("conversations in the history",
                                        float(len(engine.history.list_conversations()))),
                      "pool_ram_bytes": ("bytes of evicted KV blocks held in the host RAM pool",
                                         float(pool.ram_bytes if pool is not None else 0)),
                      "pool_spill_bytes": ("bytes of evicted KV blocks the pool spilled to disk",
                                           float(pool.spill_bytes if pool is not None else 0)),
                      "replies_streaming": ("replies being written now, taking turns a step at a time",
                                            float(streaming)),
                      "replies_waiting": ("replies waiting for a place among those written at once", float(waiting)),
                      "replies_suspended": ("replies paused while the window's reply is written (at the limit)",
                                            float(len(engine.suspended_replies())))}
            return metrics.render(gauges, kvfiles.kv_root if kvfiles is not None else None)
        return PlainTextResponse(await to_thread.run_sync(scrape), media_type="text/plain; version=0.0.4")

    @app.post("/v1/embeddings")
    async def embeddings(request: EmbeddingRequest, http: Request) -> dict:
        model_id = await to_thread.run_sync(service.model_id)
        return await embed_request(engine, request, model_id, http.is_disconnected, embedding_log)

    add_completion_route(app, engine, service, metrics)
    add_responses_routes(app, engine, service, metrics, config)      # /v1/responses
    add_llama_routes(app, engine, service, metrics)       # llama-server's /infill, /tokenize, /detokenize, /props

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest, http: Request, x_evoke_session: str | None = Header(default=None),
                   x_evoke_client: str | None = Header(default=None)):
        check_body(request)
        client = identify(x_evoke_client, bool(config.api_key))
        model_id = await to_thread.run_sync(service.check_model, request.model)
        grammar = await to_thread.run_sync(grammar_for, request, loaded_format(engine))
        if x_evoke_session is not None:
            await to_thread.run_sync(check_room_for_session, service, client, x_evoke_session)
        try:
            prepared = await service.prepare(request, x_evoke_session, throwaway(client), http.is_disconnected)
        except ApiError as exc:
            raise storage_refusal(exc) or overflow(exc, engine) from exc
        if grammar is not None:
            prepared.sampling["grammar"] = grammar
        logprobs: list[dict] | None = [] if request.logprobs else None
        if logprobs is not None:
            prepared.sampling["on_logprobs"] = logprobs.append       # filled on the engine thread, read once done
        headers = {"X-Evoke-Session": prepared.session or prepared.conv.id,
                   "X-Evoke-Conversation": prepared.conv.id}
        if client.issued:
            headers[CLIENT_HEADER] = client.issued
        loop = asyncio.get_running_loop()
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            pieces: asyncio.Queue = asyncio.Queue()
            try:
                await start_stored(service, prepared, http, pieces, loop, ended=TURN_ENDED)
                headers[JOB_HEADER] = str(prepared.future.job.id)
                headers[QUEUE_HEADER] = str(engine.queue_position(prepared.future.job.id) or 0)
            except BaseException as exc:
                service.release(prepared, loop)
                if isinstance(exc, (EvokeError, GrammarError)):
                    raise turn_error(exc, engine) from exc
                raise
            return StreamingResponse(_stream(service, prepared, pieces, model_id, include_usage, loop, metrics),
                                     media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        watcher = None
        try:
            future = service.submit(prepared)
            headers[JOB_HEADER] = str(future.job.id)
            watcher = asyncio.create_task(cancel_on_disconnect(http, prepared.future, prepared.conv.cancel))
            reply = await asyncio.wrap_future(future)
            outcome = await to_thread.run_sync(service.finish, prepared, reply)
            metrics.observe(*split_usage(outcome.usage))
        except asyncio.CancelledError:
            prepared.conv.cancel()
            raise
        except (EvokeError, GrammarError) as exc:
            raise turn_error(exc, engine) from exc
        finally:
            if watcher is not None:
                watcher.cancel()
            service.release(prepared, loop)
        return JSONResponse(_completion(model_id, outcome, logprobs), headers=headers)

    return app


JOB_HEADER = "X-Evoke-Job"   # the engine thread's job that served the request (its id in the engine's DEBUG log)
QUEUE_HEADER = "X-Evoke-Queue"   # a stream's place when it began: 0 running, N with N-1 replies to start first
PING_S = 5.0                 # an SSE comment (": ping") this often while no token comes (a long prefill)


def throwaway(client: Client) -> Client:
    """The client routing sees: a token-less request (one handed a fresh token) is that token's owner alone, never
    the shared anonymous one, so it continues no other request's conversation by re-sending its history."""
    return dataclasses.replace(client, issued=None) if client.issued else client


def check_room_for_session(service: ChatService, client: Client, session: str) -> None:
    """503 when `session` would be a new name past the sessions the server keeps in all (worker thread)."""
    if not service.sessions.room_for(client.owner, session):
        raise ApiError(503, f"the server keeps {service.sessions.max_sessions} named sessions, the most it keeps; "
                            "continue one of yours or send without X-Evoke-Session", "too_many_sessions",
                       "X-Evoke-Session")


def forget_sessions(engine: Engine, conversation_ids: list[str]) -> None:
    """Conversations whose session names were forgotten (their client's cap) become stateless: they expire as any
    one-shot conversation does, rather than stay for ever unnamed."""
    for conversation_id in conversation_ids:
        try:
            row = engine.history.get_conversation(conversation_id)
            if row is not None:
                settings = row.settings if isinstance(row.settings, dict) else {}
                engine.history.set_settings(conversation_id, {**settings, STATELESS: True})
        except EvokeError as exc:
            log.warning("endpoint: could not mark a forgotten session's conversation stateless: %s", exc)


STORAGE_HINT = "free some space on the server's disk, then send it again"
STORAGE_CODES = ("insufficient_storage", "storage_unavailable")


def storage_refusal(exc: BaseException) -> ApiError | None:
    """A 507 (the disk is full) or 503 (read-only, locked, damaged, unreadable) naming no path, when `exc` is or was
    caused by a storage failure; None otherwise."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, StoreError):
            if seen.reason == DISK_FULL:
                return ApiError(507, f"the server's disk is full: the conversation cannot be stored; {STORAGE_HINT}",
                                "insufficient_storage")
            return ApiError(503, f"the server cannot use its chat history now ({seen.reason.replace('_', ' ')}); "
                                 "try again later", "storage_unavailable")
        seen = seen.__cause__ or seen.__context__
    return None


def storage_response(refusal: ApiError) -> JSONResponse:
    """A storage refusal as OpenAI shapes a server error (`type` server_error, 507 included)."""
    body = {"error": {"message": refusal.message, "type": "server_error", "code": refusal.code, "param": None}}
    return JSONResponse(body, status_code=refusal.status, headers={"Retry-After": "5"})


def install_storage_handlers(app: FastAPI) -> None:
    """Storage failures leave as `storage_refusal` says, whether raised as they are or wrapped in an ApiError."""
    plain = app.exception_handlers[ApiError]

    async def api_error(request: Request, exc: ApiError):
        refusal = storage_refusal(exc) if exc.status >= 500 else None
        if refusal is not None or exc.code in STORAGE_CODES:
            return storage_response(refusal or exc)
        return await plain(request, exc)

    async def store_error(_: Request, exc: StoreError):
        log.warning("endpoint: storage failure: %s", exc)
        return storage_response(storage_refusal(exc))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StoreError, store_error)


def turn_error(exc: EvokeError | GrammarError, engine: Engine) -> ApiError:
    """The OpenAI-shaped error of a turn that failed before its response began."""
    refusal = storage_refusal(exc)
    if refusal is not None:
        return refusal
    if isinstance(exc, BudgetError):
        return overflow(ApiError(400, str(exc), "context_length_exceeded", "messages"), engine)
    if isinstance(exc, GrammarError):
        return ApiError(400, f"grammar: {exc}", "invalid_grammar", "grammar")
    return ApiError(500, f"generation failed: {exc}", "engine_error")


def split_usage(usage: dict) -> tuple[dict, dict]:
    """OpenAI's `usage` (with `prompt_tokens_details.cached_tokens`) and Evoke's own figures, apart."""
    figures = dict(usage.get("evoke") or {})
    openai_usage = {k: v for k, v in usage.items() if k != "evoke"}
    openai_usage["prompt_tokens_details"] = {"cached_tokens": int(figures.get("cached", 0))}
    return openai_usage, figures


def _completion(model_id: str, outcome: Outcome, logprobs: list[dict] | None = None) -> dict:
    message: dict = {"role": "assistant", "content": outcome.content}
    if outcome.tool_calls:
        message["tool_calls"] = outcome.tool_calls
    usage, figures = split_usage(outcome.usage)
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": model_id, "choices": [{"index": 0, "message": message, "finish_reason": outcome.finish_reason,
                                            "logprobs": None if logprobs is None else
                                            {"content": logprobs, "refusal": None}}],
            "usage": usage, "evoke": figures}


def openai_delta(delta: Delta) -> dict:
    """A chat chunk's `delta` for one piece of the reply: content, a call opened with its id and name (arguments
    ""), or a piece of a call's arguments, as OpenAI streams them."""
    if delta.kind == "content":
        return {"content": delta.text}
    if delta.kind == "opened":
        return {"tool_calls": [{"index": delta.index, "id": delta.call_id, "type": "function",
                                "function": {"name": delta.text, "arguments": ""}}]}
    return {"tool_calls": [{"index": delta.index, "function": {"arguments": delta.text}}]}


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


TURN_ENDED = object()        # the last item a streamed turn's queue of pieces gets


async def _stream(service: ChatService, prepared: Prepared, pieces: asyncio.Queue, model_id: str,
                  include_usage: bool, loop: asyncio.AbstractEventLoop, metrics: Metrics) -> AsyncIterator[str]:
    chunk_id, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

    def chunk(delta: dict, finish: str | None = None) -> str:
        return _sse({"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model_id,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    reader = CallReader(prepared.call_format, prepared.tool_names if prepared.tool_names else frozenset(),
                        forced=prepared.call_forced)

    def deltas(found: list[Delta]) -> list[str]:
        return [chunk(openai_delta(delta)) for delta in found]
    future = prepared.future
    position = service.engine.queue_position(future.job.id)
    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            try:
                piece = await asyncio.wait_for(pieces.get(), QUEUED_PING_S if position else PING_S)
            except TimeoutError:            # queued or a long prefill: an SSE comment says so, and keeps proxies
                position = service.engine.queue_position(future.job.id)     # and read timeouts happy
                yield f": queued {position}\n\n" if position else ": ping\n\n"
                continue
            if piece is TURN_ENDED:
                break
            for line in deltas(reader.feed(piece)):
                yield line
        try:
            reply = future.result()
        except GrammarError as exc:
            yield _sse({"error": {"message": f"grammar: {exc}", "type": "invalid_request_error",
                                  "code": "invalid_grammar", "param": "grammar"}})
            yield _sse("[DONE]")
            return
        except EvokeError as exc:
            refusal = storage_refusal(exc)
            message, code = (refusal.message, refusal.code) if refusal else (f"generation failed: {exc}",
                                                                              "engine_error")
            yield _sse({"error": {"message": message, "type": "server_error", "code": code, "param": None}})
            yield _sse("[DONE]")
            return
        for line in deltas(reader.close()):
            yield line
        outcome = await to_thread.run_sync(service.finish, prepared, reply, reader)
        metrics.observe(*split_usage(outcome.usage))
        yield chunk({}, outcome.finish_reason)
        if include_usage:
            usage, figures = split_usage(outcome.usage)
            yield _sse({"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model_id,
                        "choices": [], "usage": usage, "evoke": figures})
        yield _sse("[DONE]")
    finally:
        if prepared.future is not None and not prepared.future.done():
            prepared.conv.cancel()             # the client went away: stop, keep the partial reply
        service.release(prepared, loop)
