"""`POST /v1/completions`: OpenAI's legacy raw-text completion, stateless, on the engine thread (`Engine.complete`),
with a `suffix` for fill-in-the-middle where the model has FIM tokens (editor autocompletion).

Invariants: the prompt is tokenized and sized on a worker thread (the vocabulary-only copy), never on the engine
thread; a prompt that with its reply exceeds a conversation's context is OpenAI's `context_length_exceeded`, one over
what a request may have decoded (`--max-prefill-tokens`) a 400 too, a `suffix` for a model without FIM tokens a 400
saying so, token ids outside the vocabulary a 400; a client that leaves cancels its completion; nothing is stored.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator

from anyio import to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .. import Completion, Engine, GrammarError
from ..errors import ContextFullError
from .api_errors import ApiError, context_length, overflow
from .metrics import Metrics
from .request_bodies import CompletionRequest, check_body
from .service import ChatService, cancel_on_disconnect

FINISH_REASONS = {"eos": "stop", "stop": "stop", "cancelled": "stop", "max_tokens": "length", "length": "length"}
PING_S = 5.0                 # an SSE comment this often while no text comes (a long prompt's decode)
DEFAULT_MAX_TOKENS = 16      # OpenAI's default for this endpoint


def add_completion_route(app: FastAPI, engine: Engine, service: ChatService, metrics: Metrics) -> None:
    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, http: Request):
        check_body(request)
        model_id = await to_thread.run_sync(service.check_model, request.model)
        tokens = await to_thread.run_sync(prompt_tokens, service, request)
        if request.logit_bias:
            await to_thread.run_sync(service.check_logit_bias, request.logit_bias)
        sampling = request.sampling(DEFAULT_MAX_TOKENS)
        check_fits(engine, service, len(tokens), sampling["max_tokens"])
        if request.grammar:
            sampling["grammar"] = request.grammar
        reports: list[dict] | None = [] if request.logprobs is not None else None
        if reports is not None:
            sampling["on_logprobs"] = reports.append           # filled on the engine thread, read once done
        cancel = threading.Event()
        reply = _Reply(model_id, len(tokens))
        if request.stream:
            loop = asyncio.get_running_loop()
            pieces: asyncio.Queue = asyncio.Queue()
            future = engine.complete(tokens, cancel=cancel, **sampling,
                                     on_token=lambda p: loop.call_soon_threadsafe(pieces.put_nowait, p))
            future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return StreamingResponse(reply.stream(future, pieces, cancel, include_usage, metrics),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        done = await finished_completion(engine, http, tokens, cancel, sampling)
        metrics.observe(*usage_and_figures(done))
        return JSONResponse(reply.body(done, legacy_logprobs(reports) if reports is not None else None))


def prompt_tokens(service: ChatService, request: CompletionRequest) -> list[int]:
    """The prompt's tokens (worker thread): text tokenized with BOS and special-token markup as llama-server does,
    token ids checked against the vocabulary, or the fill-in-the-middle layout when a `suffix` is given."""
    vocab = service.vocabulary()
    text = request.single_text()
    if request.suffix:
        tokens = vocab.infill(text or "", request.suffix)
        if tokens is None:
            raise ApiError(400, "suffix: this model has no fill-in-the-middle tokens (FIM_PRE, FIM_SUF, FIM_MID are "
                                "absent from its vocabulary), so it cannot fill a gap; send the prompt without a "
                                "suffix, or load a model trained for infill (Qwen2.5-Coder, CodeLlama, StarCoder2)",
                           "unsupported_parameter", "suffix")
    elif text is not None:
        tokens = vocab.tokenize(text, add_special=True, parse_special=True)
    else:
        tokens = request.token_ids()
        bad = next((t for t in tokens if not 0 <= t < vocab.n_tokens), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary (0..{vocab.n_tokens - 1})",
                           "invalid_prompt", "prompt")
    if not tokens:
        raise ApiError(400, "prompt: empty (nothing to continue)", "invalid_prompt", "prompt")
    return tokens


def check_fits(engine: Engine, service: ChatService, n_prompt: int, max_tokens: int) -> None:
    """400 when the prompt and its reply exceed a conversation's context, or the prompt what one request may have
    decoded."""
    room = context_length(engine)
    if n_prompt + max_tokens > room:
        raise overflow(ApiError(400, f"the prompt is {n_prompt} tokens and max_tokens {max_tokens}; together "
                                     f"{n_prompt + max_tokens - room} over", "context_length_exceeded", "prompt"),
                       engine)
    limit = service.prefill_limit()
    if n_prompt > limit:
        raise ApiError(400, f"the prompt is {n_prompt} tokens, {n_prompt - limit} over the {limit} that one request "
                            "may have decoded on this server", "context_length_exceeded", "prompt")


def completion_error(exc: ContextFullError | GrammarError, n_prompt: int) -> ApiError:
    if isinstance(exc, GrammarError):
        return ApiError(400, f"grammar: {exc}", "invalid_grammar", "grammar")
    return ApiError(503, f"the context has no free room for this prompt's {n_prompt} tokens now (the open "
                         "conversations hold it); retry later", "context_full")


def legacy_logprobs(reports: list[dict]) -> dict:
    """The sampler's per-token reports in the completions API's shape: tokens, token_logprobs, top_logprobs (token
    -> logprob), text_offset."""
    offsets, at = [], 0
    for report in reports:
        offsets.append(at)
        at += len(report["token"])
    return {"tokens": [r["token"] for r in reports], "token_logprobs": [r["logprob"] for r in reports],
            "top_logprobs": [{t["token"]: t["logprob"] for t in r["top_logprobs"]} for r in reports],
            "text_offset": offsets}


async def finished_completion(engine: Engine, http: Request, tokens: list[int], cancel: threading.Event,
                              sampling: dict) -> Completion:
    """A raw completion run to its end (not streamed): cancelled when the client leaves, its refusals as 400s."""
    future = engine.complete(tokens, cancel=cancel, **sampling)
    watcher = asyncio.create_task(cancel_on_disconnect(http, future, cancel.set))
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        cancel.set()
        raise
    except (ContextFullError, GrammarError) as exc:
        raise completion_error(exc, len(tokens)) from exc
    finally:
        watcher.cancel()


def usage_and_figures(done: Completion) -> tuple[dict, dict]:
    usage = {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.n_tokens,
             "total_tokens": done.prompt_tokens + done.n_tokens, "prompt_tokens_details": {"cached_tokens": 0}}
    return usage, {"decoded": done.prompt_tokens, "engine_ttft_ms": round(done.ttft_s * 1000, 1)}


class _Reply:
    """One completion's response: its id, and its JSON body or SSE chunks."""

    def __init__(self, model_id: str, n_prompt: int) -> None:
        self.id, self.created, self.model_id = "cmpl-" + uuid.uuid4().hex, int(time.time()), model_id
        self.n_prompt = n_prompt

    def _object(self, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_id,
                "choices": choices, **extra}

    def body(self, done: Completion, logprobs: dict | None) -> dict:
        usage, _ = usage_and_figures(done)
        return self._object([{"index": 0, "text": done.text, "logprobs": logprobs,
                              "finish_reason": FINISH_REASONS[done.stopped]}], usage=usage)

    def _sse(self, text: str, finish: str | None = None) -> str:
        return "data: " + json.dumps(self._object([{"index": 0, "text": text, "logprobs": None,
                                                   "finish_reason": finish}])) + "\n\n"

    async def stream(self, future, pieces: asyncio.Queue, cancel: threading.Event, include_usage: bool,
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
                yield self._sse(piece)
            try:
                done = future.result()
            except (ContextFullError, GrammarError) as exc:
                error = completion_error(exc, self.n_prompt)
                yield "data: " + json.dumps(error.body()) + "\n\n"
                yield "data: [DONE]\n\n"
                return
            metrics.observe(*usage_and_figures(done))
            yield self._sse("", FINISH_REASONS[done.stopped])
            if include_usage:
                yield "data: " + json.dumps(self._object([], usage=usage_and_figures(done)[0])) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not future.done():
                cancel.set()              # the client went away
