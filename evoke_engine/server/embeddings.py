"""`POST /v1/embeddings` from the engine's bundled sentence embedder (MiniLM by default, the `embedder` setting).

Invariants: vectors are the embedder's own (float32, L2-normalised, its dimension); they are computed on the
engine thread, where the engine uses the same embedder; `encoding_format` is `float` or `base64` (little-endian
float32, as OpenAI's); `dimensions` other than the embedder's and token-id input are refused by name (400); an
embedder set to "off" answers 400 saying so.
"""

from __future__ import annotations

import base64

import numpy as np
from pydantic import Field

from .. import Command, Engine
from .api_errors import ApiError
from .request_bodies import Loose

MAX_INPUTS = 256


class EmbeddingRequest(Loose):
    input: str | list[str] = Field(min_length=1)
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


def embed(engine: Engine, request: EmbeddingRequest, model_id: str) -> dict:
    """The OpenAI embeddings response (blocks: call on a worker thread)."""
    texts = [request.input] if isinstance(request.input, str) else list(request.input)
    if len(texts) > MAX_INPUTS:
        raise ApiError(400, f"input holds {len(texts)} texts; at most {MAX_INPUTS} per request", "too_many_inputs",
                       "input")
    if request.encoding_format not in ("float", "base64"):
        raise ApiError(400, f"encoding_format {request.encoding_format!r} is not supported (float, base64)",
                       "unsupported_parameter", "encoding_format")

    def compute():
        embedder = engine.ensure_model().embedder
        if not embedder.enabled:
            raise ApiError(400, "the embedder is off (the `embedder` setting): no embeddings", "embedder_off", "model")
        return embedder.embed(texts), embedder.dimension(), embedder.identity

    vectors, dimension, name = engine.thread.call(compute, command=Command.EMBED)
    if request.dimensions is not None and request.dimensions != dimension:
        raise ApiError(400, f"dimensions: this embedder's vectors have {dimension} dimensions", "unsupported_parameter",
                       "dimensions")
    data = []
    for index, vector in enumerate(np.asarray(vectors, dtype=np.float32)):
        value = (base64.b64encode(vector.astype("<f4").tobytes()).decode() if request.encoding_format == "base64"
                 else vector.tolist())
        data.append({"object": "embedding", "index": index, "embedding": value})
    tokens = sum(len(text.split()) for text in texts)          # the embedder's own tokenizer is not exposed
    return {"object": "list", "data": data, "model": name or model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
