"""`POST /v1/embeddings` from the engine's bundled sentence embedder (MiniLM by default, the `embedder` setting).

Invariants: vectors are the embedder's own (float32, L2-normalised, its dimension); they are computed on the
engine thread, where the engine uses the same embedder; `encoding_format` is `float` or `base64` (little-endian
float32, as OpenAI's); `dimensions` other than the embedder's are refused by name (400); an embedder set to "off"
answers 400 saying so; `model` is this server's model or its embedder, by any of their names, else a 404 as chat's.
A request is sized before any work (at most `MAX_INPUTS` inputs, `MAX_INPUT_CHARS` characters or `MAX_INPUT_TOKENS`
ids each, `MAX_REQUEST_CHARS` characters or `MAX_REQUEST_TOKENS` ids in all: past them a 413 that says which; a lone
surrogate is a 400 that names the input) and embedded in parts of at most `PART_TEXTS` texts and `PART_COST`
characters, each its own NORMAL engine job submitted only once the one before has ended: a turn queued meanwhile runs
between two parts, and a client that leaves stops the request before its next part (issue 57).
Token-id input (a list of ints, or a list of such lists, as OpenAI accepts) is read in the embedder's own vocabulary:
the ids are decoded with the embedder's tokenizer (special tokens skipped) and the text embedded, so ids from another
tokenizer (tiktoken's, which LangChain sends unless `check_embedding_ctx_length=False`) name other words; an id
outside the vocabulary is a 400.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field, StrictInt

from .. import BUNDLED_EMBEDDER as BUNDLED
from .. import NORMAL, Command, Engine
from .api_errors import ApiError
from .request_bodies import Loose
from .service import MODEL_ALIASES

MAX_INPUTS = 256
MAX_INPUT_CHARS = 32_768            # one text (the embedder reads its first few hundred tokens)
MAX_REQUEST_CHARS = 1 << 20         # all the texts of one request
MAX_INPUT_TOKENS = 8_192            # one list of token ids (OpenAI's limit per input)
MAX_REQUEST_TOKENS = 262_144        # all the token ids of one request
PART_TEXTS = 16                     # texts in one engine job
PART_COST = 8_192                   # characters in one engine job (a text counts at most `TEXT_COST_CAP`)
TEXT_COST_CAP = 4_096               # past it a text costs the embedder no more (it truncates)

TokenIds = list[StrictInt]
EmbeddingInput = str | list[str] | TokenIds | list[TokenIds]


class EmbeddingRequest(Loose):
    input: EmbeddingInput = Field(min_length=1)
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


class ClientLeft(ApiError):
    def __init__(self) -> None:
        super().__init__(499, "the client closed the embeddings request before it was done", "client_closed")


@dataclass
class EmbeddingLog:
    """What the endpoint's embeddings requests did, for tests and diagnostics (event loop only)."""
    parts_run: int = 0
    requests_stopped: int = 0              # requests whose client left before their last part
    part_jobs: list[int] = field(default_factory=list)      # engine job ids of the parts, latest last (bounded)

    def ran(self, job_id: int) -> None:
        self.parts_run += 1
        self.part_jobs.append(job_id)
        del self.part_jobs[:-256]


@dataclass(frozen=True)
class Inputs:
    """A request's input, as texts or as lists of token ids (never both)."""
    texts: list[str] | None = None
    ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.ids)


def read_inputs(value: EmbeddingInput) -> Inputs:
    """The request's input as texts or token-id lists, sized (413 past a limit, 400 for an empty one)."""
    if isinstance(value, str):
        return sized_texts([value])
    if value and all(isinstance(item, int) for item in value):
        return sized_ids([list(value)])
    if value and all(isinstance(item, list) for item in value):
        return sized_ids([list(item) for item in value])
    return sized_texts(list(value))


def _too_many(count: int) -> None:
    if count > MAX_INPUTS:
        raise ApiError(413, f"input holds {count} inputs; at most {MAX_INPUTS} per request", "too_many_inputs",
                       "input")


def sized_texts(texts: list[str]) -> Inputs:
    _too_many(len(texts))
    for index, text in enumerate(texts):
        if len(text) > MAX_INPUT_CHARS:
            raise ApiError(413, f"input[{index}] is {len(text)} characters; at most {MAX_INPUT_CHARS} per input",
                           "input_too_large", "input")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ApiError(400, f"input[{index}] holds a lone UTF-16 surrogate at character {exc.start}; send "
                                "valid Unicode", "invalid_unicode", "input") from None
    total = sum(len(text) for text in texts)
    if total > MAX_REQUEST_CHARS:
        raise ApiError(413, f"input is {total} characters in all; at most {MAX_REQUEST_CHARS} per request",
                       "input_too_large", "input")
    return Inputs(texts=texts)


def sized_ids(lists: list[list[int]]) -> Inputs:
    _too_many(len(lists))
    for index, ids in enumerate(lists):
        if not ids:
            raise ApiError(400, f"input[{index}] is an empty list of token ids", "invalid_input", "input")
        if len(ids) > MAX_INPUT_TOKENS:
            raise ApiError(413, f"input[{index}] is {len(ids)} token ids; at most {MAX_INPUT_TOKENS} per input",
                           "input_too_large", "input")
    total = sum(len(ids) for ids in lists)
    if total > MAX_REQUEST_TOKENS:
        raise ApiError(413, f"input is {total} token ids in all; at most {MAX_REQUEST_TOKENS} per request",
                       "input_too_large", "input")
    return Inputs(ids=lists)


def embedder_names(embedder_setting: str) -> set[str]:
    """The names the embedder answers to: its identity (`bundled:all-MiniLM-L6-v2` or its path) and its last part."""
    identity = embedder_setting or BUNDLED
    tail = identity.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].split(":")[-1]
    return {identity, tail}


def check_model(name: str | None, model_id: str, embedder_setting: str) -> None:
    """404 (as chat's) unless `name` is empty, this server's model by one of its names, or its embedder's."""
    if not name:
        return
    accepted = {model_id, f"{model_id}.gguf", *MODEL_ALIASES, *embedder_names(embedder_setting)}
    if name not in accepted:
        raise ApiError(404, f"model {name!r} does not exist; this server embeds with {sorted(accepted)[0]!r} "
                            f"(also called {', '.join(sorted(accepted)[1:])})", "model_not_found", "model")


def check_options(request: EmbeddingRequest) -> None:
    if request.encoding_format not in ("float", "base64"):
        raise ApiError(400, f"encoding_format {request.encoding_format!r} is not supported (float, base64)",
                       "unsupported_parameter", "encoding_format")


def parts_of(texts: list[str]) -> list[list[str]]:
    """`texts` in order, in parts of at most `PART_TEXTS` texts and `PART_COST` characters (one text at least)."""
    parts: list[list[str]] = []
    part: list[str] = []
    cost = 0
    for text in texts:
        weight = min(len(text), TEXT_COST_CAP)
        if part and (len(part) >= PART_TEXTS or cost + weight > PART_COST):
            parts.append(part)
            part, cost = [], 0
        part.append(text)
        cost += weight
    if part:
        parts.append(part)
    return parts


def _enabled_embedder(engine: Engine):
    embedder = engine.ensure_model().embedder
    if not embedder.enabled:
        raise ApiError(400, "the embedder is off (the `embedder` setting): no embeddings", "embedder_off", "model")
    if embedder.unavailable:
        raise ApiError(503, embedder.unavailable, "embedder_unavailable")
    return embedder


def _tokenizer_of(embedder):
    """(vocabulary size, decode(ids) -> text) of the embedder's own tokenizer (engine thread: loads it)."""
    encoder = embedder._load()
    tokenizer = getattr(encoder, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "get_vocab_size"):         # ONNX: a `tokenizers.Tokenizer`
        return tokenizer.get_vocab_size(), lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    tokenizer = encoder.model.tokenizer                                         # sentence-transformers: HF's
    return len(tokenizer), lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def decode_ids(engine: Engine, lists: list[list[int]]) -> list[str]:
    """Token-id lists as the texts they spell in the embedder's vocabulary (engine thread); 400 past it."""
    size, decode = _tokenizer_of(_enabled_embedder(engine))
    for index, ids in enumerate(lists):
        bad = next((i for i in ids if not 0 <= i < size), None)
        if bad is not None:
            raise ApiError(400, f"input[{index}] holds the token id {bad}, outside the embedder's vocabulary of "
                                f"{size} ids (token ids are read in the embedder's own tokenizer)", "invalid_input",
                           "input")
    return [decode(ids) for ids in lists]


def embed_part(engine: Engine, texts: list[str]) -> tuple[np.ndarray, int, str | None]:
    """One part's vectors, the embedder's dimension and identity (engine thread)."""
    embedder = _enabled_embedder(engine)
    vectors = embedder.embed(texts)
    if vectors is None:                            # it could not load here (said in `unavailable`)
        raise ApiError(503, embedder.unavailable or "the embedder is not ready", "embedder_unavailable")
    return np.asarray(vectors, dtype=np.float32), embedder.dimension(), embedder.identity


async def _on_engine(engine: Engine, fn, *args, about: str) -> tuple:
    future = engine.thread.submit(fn, engine, *args, priority=NORMAL, command=Command.EMBED, about=about)
    return await asyncio.wrap_future(future), future.job.id


async def embed_request(engine: Engine, request: EmbeddingRequest, model_id: str,
                        disconnected: Callable[[], Awaitable[bool]], log: EmbeddingLog | None = None) -> dict:
    """The OpenAI embeddings response: sized, then embedded part by part (each an engine job), stopped before the
    next part once `disconnected()` says the client left."""
    log = log or EmbeddingLog()
    check_options(request)
    check_model(request.model, model_id, engine.settings.embedder)
    inputs = read_inputs(request.input)
    embedder = engine.model.embedder if engine.model is not None else None
    if embedder is not None and embedder.warming:           # its first load runs on a thread of its own: wait
        await asyncio.to_thread(embedder.wait_warm)         # here, never in an engine job
    texts = inputs.texts
    if texts is None:
        texts, _ = await _on_engine(engine, decode_ids, inputs.ids, about="embeddings: token ids")
    vectors: list[np.ndarray] = []
    dimension, name = None, None
    parts = parts_of(texts)
    for number, part in enumerate(parts, 1):
        if await disconnected():
            log.requests_stopped += 1
            raise ClientLeft()
        (part_vectors, dimension, name), job_id = await _on_engine(
            engine, embed_part, part, about=f"embeddings part {number}/{len(parts)}")
        log.ran(job_id)
        vectors.append(part_vectors)
    if request.dimensions is not None and request.dimensions != dimension:
        raise ApiError(400, f"dimensions: this embedder's vectors have {dimension} dimensions", "unsupported_parameter",
                       "dimensions")
    tokens = (sum(len(ids) for ids in inputs.ids) if inputs.ids is not None
              else sum(len(text.split()) for text in texts))     # words: the embedder's tokenizer is not counted
    return {"object": "list", "data": _data(np.concatenate(vectors), request.encoding_format),
            "model": name or model_id, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _data(vectors: np.ndarray, encoding_format: str) -> list[dict]:
    data = []
    for index, vector in enumerate(vectors):
        value = (base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding_format == "base64"
                 else vector.tolist())
        data.append({"object": "embedding", "index": index, "embedding": value})
    return data
