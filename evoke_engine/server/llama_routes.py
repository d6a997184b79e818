"""llama-server's own routes, for the editor plugins and tools written against it (llama.vim, llama.vscode):
`POST /infill` (fill-in-the-middle on `Engine.complete`), `POST /tokenize`, `POST /detokenize`, `GET /props`.

Invariants: bodies and replies have llama-server's shapes (`{"content": ..., "stop": true, ...}`, streamed as
`data: {...}` lines without `[DONE]`); tokens are counted, made and read on the vocabulary-only copy on a worker
thread, never on the engine thread; /tokenize takes at most `MAX_TOKENIZE_CHARS` characters and /detokenize
`MAX_DETOKENIZE_TOKENS` ids (a 413 past them, ids outside the vocabulary a 400); /infill on a model without
fill-in-the-middle tokens is a 501 naming `/v1/completions`; its extra context (`input_extra`) is dropped oldest
first where it would not fit, a prefix and suffix that alone do not fit are OpenAI's `context_length_exceeded`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Any

from anyio import to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from .. import Completion, Engine, GrammarError
from ..errors import ContextFullError
from .api_errors import ApiError, context_length
from .completions import check_fits, completion_error, finished_completion, usage_and_figures
from .metrics import Metrics
from .request_bodies import Loose, unpaired_surrogate
from .service import ChatService
from .toolcall_formats import loaded_format

MAX_TOKENIZE_CHARS = 1 << 20          # /tokenize: a longer `content` is a 413 (the body limit is 8 MiB)
MAX_DETOKENIZE_TOKENS = 1 << 18       # /detokenize: more ids is a 413
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"     # llama-server's separator of extra chunks without FIM_SEP tokens
PING_S = 5.0
STOP_TYPES = {"eos": "eos", "stop": "word", "max_tokens": "limit", "length": "limit", "cancelled": "none"}


class TokenizeRequest(Loose):
    content: str
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class DetokenizeRequest(Loose):
    tokens: list[StrictInt]


class ExtraChunk(Loose):
    filename: str = "tmp"
    text: str = ""


class InfillRequest(Loose):
    """llama-server's /infill body: the text before and after the cursor, extra context, the sampler's settings."""
    model_config = ConfigDict(extra="allow")
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""                      # the current line up to the cursor (llama.vim), after the prefix
    n_predict: StrictInt = -1             # -1: as many as the context allows, up to the server's max_tokens
    stream: StrictBool = False
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=5.0)
    top_k: StrictInt | None = Field(default=None, ge=0)
    top_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    min_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: StrictFloat | None = Field(default=None, gt=0.0, le=5.0)
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    seed: StrictInt | None = None
    stop: list[str] | None = None

    def sampling(self) -> dict[str, Any]:
        keys = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
                "seed")
        out = {key: getattr(self, key) for key in keys if getattr(self, key) is not None}
        if self.stop:
            out["stop"] = list(self.stop)
        return out


def add_llama_routes(app: FastAPI, engine: Engine, service: ChatService, metrics: Metrics) -> None:
    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> dict:
        check_text(request.content, "content")
        if len(request.content) > MAX_TOKENIZE_CHARS:
            raise ApiError(413, f"content is {len(request.content)} characters; /tokenize takes at most "
                                f"{MAX_TOKENIZE_CHARS}", "request_too_large", "content")
        return await to_thread.run_sync(tokenized, service, request)

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> dict:
        if len(request.tokens) > MAX_DETOKENIZE_TOKENS:
            raise ApiError(413, f"tokens holds {len(request.tokens)} ids; /detokenize takes at most "
                                f"{MAX_DETOKENIZE_TOKENS}", "request_too_large", "tokens")
        return await to_thread.run_sync(detokenized, service, request.tokens)

    @app.get("/props")
    async def props() -> dict:
        return await to_thread.run_sync(server_props, engine, service)

    @app.post("/infill")
    async def infill(request: InfillRequest, http: Request):
        for name in ("input_prefix", "input_suffix", "prompt"):
            check_text(getattr(request, name), name)
        model_id = await to_thread.run_sync(service.check_model, None)
        tokens, max_tokens = await to_thread.run_sync(infill_tokens, engine, service, request)
        check_fits(engine, service, len(tokens), max_tokens)
        cancel = threading.Event()
        sampling = {**request.sampling(), "max_tokens": max_tokens}
        reply = InfillReply(model_id, len(tokens), context_length(engine))
        if request.stream:
            loop = asyncio.get_running_loop()
            pieces: asyncio.Queue = asyncio.Queue()
            future = engine.complete(tokens, cancel=cancel, **sampling,
                                     on_token=lambda p: loop.call_soon_threadsafe(pieces.put_nowait, p))
            future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
            return StreamingResponse(reply.stream(future, pieces, cancel, metrics), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        done = await finished_completion(engine, http, tokens, cancel, sampling)
        metrics.observe(*usage_and_figures(done))
        return JSONResponse(reply.final(done))


def check_text(text: str, field: str) -> None:
    """400 for a lone UTF-16 surrogate in `text` (it cannot be tokenized)."""
    found = unpaired_surrogate(text, field)
    if found is not None:
        raise ApiError(400, f"{found[0]}: a lone UTF-16 surrogate at character {found[1]}; text must be valid "
                            "Unicode", "invalid_unicode", field)


def tokenized(service: ChatService, request: TokenizeRequest) -> dict:
    """llama-server's /tokenize reply (worker thread): ids, or {id, piece} with the piece as text where it is valid
    UTF-8 and as its byte values where it is not (part of a character)."""
    vocab = service.vocabulary()
    tokens = vocab.tokenize(request.content, add_special=request.add_special, parse_special=request.parse_special)
    if not request.with_pieces:
        return {"tokens": tokens}
    out = []
    for token in tokens:
        piece = vocab.piece(token)
        try:
            out.append({"id": token, "piece": piece.decode("utf-8")})
        except UnicodeDecodeError:
            out.append({"id": token, "piece": list(piece)})
    return {"tokens": out}


def detokenized(service: ChatService, tokens: list[int]) -> dict:
    vocab = service.vocabulary()
    bad = next((t for t in tokens if not 0 <= t < vocab.n_tokens), None)
    if bad is not None:
        raise ApiError(400, f"tokens: token id {bad} is outside the vocabulary (0..{vocab.n_tokens - 1})",
                       "invalid_tokens", "tokens")
    return {"content": vocab.detokenize(tokens)}


def server_props(engine: Engine, service: ChatService) -> dict:
    """llama-server's /props from the engine's public model information (worker thread: it waits for the load)."""
    info, settings = engine.model_info(), engine.settings
    model = engine.diagnostics()
    template = model.template.source if model is not None else None
    params = {"n_predict": settings.max_tokens, "temperature": settings.temperature, "top_k": settings.top_k,
              "top_p": settings.top_p, "min_p": settings.min_p, "repeat_penalty": settings.repeat_penalty,
              "seed": settings.seed}
    return {"default_generation_settings": {"n_ctx": context_length(engine), "params": params,
                                            "model": service.model_id()},
            "total_slots": settings.slots, "model_path": info.path, "model_alias": service.model_id(),
            "chat_template": template or "", "n_ctx_train": info.n_ctx_train, "n_params": info.n_params,
            "modalities": {"vision": False, "audio": False},
            "build_info": f"evoke-desk {_version()} ({info.device})",
            "tool_call_format": loaded_format(engine).name,
            "infill": service.vocabulary().infill("", "") is not None}


def _version() -> str:
    try:
        return metadata.version("evoke-desk")
    except metadata.PackageNotFoundError:
        return "unknown"


def infill_tokens(engine: Engine, service: ChatService, request: InfillRequest) -> tuple[list[int], int]:
    """The fill-in-the-middle prompt (worker thread) and the reply's length: [BOS] FIM_PRE extra + prefix + prompt
    FIM_SUF suffix FIM_MID, the extra chunks as llama-server lays them out where the model has no FIM_SEP token
    (separated by `SNIPPET_SEPARATOR`), the oldest dropped while the whole would not fit with the reply."""
    vocab = service.vocabulary()
    prefix = request.input_prefix + request.prompt
    tokens = vocab.infill(prefix, request.input_suffix)
    if tokens is None:
        raise ApiError(501, "/infill: this model has no fill-in-the-middle tokens (FIM_PRE, FIM_SUF, FIM_MID are "
                            "absent from its vocabulary), so it cannot fill a gap; continue the text before the "
                            "cursor with POST /v1/completions (a prompt, no suffix), or load a model trained for "
                            "infill (Qwen2.5-Coder, CodeLlama, StarCoder2)", "fim_unsupported", "input_suffix")
    room = context_length(engine)
    max_tokens = request.n_predict if request.n_predict > 0 else max(1, min(engine.settings.max_tokens,
                                                                          room - len(tokens)))
    extras = [f"{chunk.filename}\n{chunk.text}" for chunk in request.input_extra]
    while extras:
        extra = "".join(SNIPPET_SEPARATOR + text for text in extras) + SNIPPET_SEPARATOR
        with_extra = vocab.infill(extra + prefix, request.input_suffix) or tokens
        if len(with_extra) + max_tokens <= room and len(with_extra) <= service.prefill_limit():
            return with_extra, max_tokens
        extras.pop(0)                               # the oldest chunk goes first, as llama-server keeps the last
    return tokens, max_tokens


class InfillReply:
    """One /infill response in llama-server's shape: the final object, or `data:` lines of pieces then it."""

    def __init__(self, model_id: str, n_prompt: int, n_ctx: int) -> None:
        self.model_id, self.n_prompt, self.n_ctx = model_id, n_prompt, n_ctx
        self.started = time.perf_counter()

    def final(self, done: Completion, content: str | None = None) -> dict:
        elapsed_ms = (time.perf_counter() - self.started) * 1000
        prompt_ms = done.ttft_s * 1000
        predicted_ms = max(elapsed_ms - prompt_ms, 1e-3)
        text = done.text if content is None else content
        return {"index": 0, "content": text, "tokens": [], "id_slot": -1, "stop": True, "model": self.model_id,
                "tokens_predicted": done.n_tokens, "tokens_evaluated": done.prompt_tokens,
                "generation_settings": {"n_ctx": self.n_ctx, "n_predict": done.n_tokens},
                "prompt": "", "has_new_line": "\n" in done.text, "truncated": False,
                "stop_type": STOP_TYPES.get(done.stopped, "none"), "stopping_word": "", "tokens_cached": 0,
                "timings": {"prompt_n": done.prompt_tokens, "prompt_ms": round(prompt_ms, 3),
                            "prompt_per_second": done.prompt_tokens / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
                            "predicted_n": done.n_tokens, "predicted_ms": round(predicted_ms, 3),
                            "predicted_per_second": done.n_tokens / predicted_ms * 1000}}

    async def stream(self, future, pieces: asyncio.Queue, cancel: threading.Event,
                     metrics: Metrics) -> AsyncIterator[str]:
        try:
            while True:
                try:
                    piece = await asyncio.wait_for(pieces.get(), PING_S)
                except TimeoutError:
                    yield ": ping\n\n"
                    continue
                if piece is None:
                    break
                yield _line({"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": -1})
            try:
                done = future.result()
            except (ContextFullError, GrammarError) as exc:
                yield _line(completion_error(exc, self.n_prompt).body())
                return
            metrics.observe(*usage_and_figures(done))
            yield _line(self.final(done, content=""))
        finally:
            if not future.done():
                cancel.set()                          # the client went away


def _line(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"

