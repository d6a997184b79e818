"""A stateless raw-text completion (`/v1/completions`): the prompt's tokens decoded into the completion's own
sequence, a reply sampled with llama.cpp's sampler chain, nothing kept. It runs as a stream (`Command.COMPLETE`):
its prefill chunks and tokens take turns with the replies' steps.

Invariants: on the engine (its stream holds it between steps); one completion at a time (the worker admits one);
its sequence is empty again when `complete` returns or raises; no conversation, history row or KV file is
touched; a prompt and reply that do
not fit the free cells of the context raise `ContextFullError` before any token is sampled or mid-reply (the reply so
far is then returned, stopped "length"), never by truncating the prompt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ContextFullError
from ..runtime.reply_text import ReplyText
from ..runtime.runtime import Cancelled
from ..runtime.sampling import SamplingParams
from .loaded_model import LoadedModel


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    n_tokens: int
    stopped: str              # eos | max_tokens | stop | cancelled | length (the context filled mid-reply)
    ttft_s: float


def complete(model: LoadedModel, tokens: list[int], params: SamplingParams,
             on_token: Callable[[str], None] | None, cancel: threading.Event, *, seq: int | None = None,
             prefill_chunk: int = 0) -> Completion:
    """Decode `tokens` (a whole prompt, BOS included where wanted) and sample up to `params.max_tokens`, in the
    completion's sequence (or `seq`: the scratch, for work that runs as one plain job between other streams' steps,
    while a completion stream may hold its own); `prefill_chunk` tokens a decode at most, `cancel` read before each
    (a plain job's prefill that other work must not wait for whole)."""
    rt, kv = model.rt, model.kv
    seq = rt.completion_seq if seq is None else seq
    context = rt.context_of(seq)
    started = time.perf_counter()
    reply = ReplyText(rt.token_bytes, params.stop)
    n_generated, stopped, ttft = 0, "max_tokens", 0.0
    try:
        try:
            rt.decode(tokens, seq, 0, cancel=cancel, chunk=prefill_chunk)
        except Cancelled:
            return Completion("", len(tokens), 0, "cancelled", 0.0)
        with rt.sampler(params, context, seq=seq) as sampler:
            while True:                  # ends at a stop, the end token, max_tokens (checked before a decode)
                if cancel.is_set():
                    stopped = "cancelled"
                    break
                token = sampler.sample()
                if rt.is_eog(token):
                    stopped = "eos"
                    break
                piece, stop = reply.add(token)
                if not ttft:
                    ttft = time.perf_counter() - started
                if piece and on_token is not None:
                    on_token(piece)
                if stop:
                    stopped = "stop"
                    break
                n_generated += 1
                if n_generated == params.max_tokens:
                    break
                try:
                    rt.decode([token], seq, len(tokens) + n_generated - 1)
                except ContextFullError:
                    stopped = "length"
                    break
    finally:
        kv.drop(seq)
    rest = reply.finish() if stopped != "stop" else ""
    if rest and on_token is not None:
        on_token(rest)
    return Completion(reply.text, len(tokens), n_generated, stopped, ttft)
