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
    prefilled: int | None = None   # prompt tokens this call decoded where not all (cut in its prefill, or resumed)

    @property
    def prompt_decoded(self) -> int:
        """Prompt tokens this call decoded: all of them, unless it was cut in its prefill or resumed held cells."""
        return self.prompt_tokens if self.prefilled is None else self.prefilled


@dataclass(frozen=True)
class HeldCompletion:
    """A completion cut short, kept to go on later (`complete(resume=...)`): every token decoded so far (the prompt's,
    then the reply's) and the sequence's cells as llama.cpp's state (`KVCache.hold_cells`)."""
    tokens: tuple[int, ...]
    cells: bytes


def complete(model: LoadedModel, tokens: list[int], params: SamplingParams,
             on_token: Callable[[str], None] | None, cancel: threading.Event, *, seq: int | None = None,
             prefill_chunk: int = 0, resume: HeldCompletion | None = None,
             hold: Callable[[HeldCompletion], None] | None = None) -> Completion:
    """Decode `tokens` (a whole prompt, BOS included where wanted) and sample up to `params.max_tokens`, in the
    completion's sequence (or `seq`: the scratch, for work that runs as one plain job between other streams' steps,
    while a completion stream may hold its own); `prefill_chunk` tokens a decode at most, `cancel` read before each
    (a plain job's prefill that other work must not wait for whole). A call cut by `cancel` after decoding something
    hands `hold` what it decoded; `resume` (the same prompt's) puts those cells back and goes on from there: the last
    held token decodes again (its logits), then the rest of the prompt or the reply. The cells come back as they
    were, but llama.cpp may put them at other cells, and the CPU's rounding follows placement: a near-tie can then
    go another way than uncut (docs/testing.md)."""
    rt, kv = model.rt, model.kv
    seq = rt.completion_seq if seq is None else seq
    context = rt.context_of(seq)
    started = time.perf_counter()
    reply = ReplyText(rt.token_bytes, params.stop)
    generated: list[int] = []
    stopped, ttft, start = "max_tokens", 0.0, 0
    try:
        if resume is not None and _resumable(resume, tokens) and kv.put_back_cells(seq, resume.cells):
            start = len(resume.tokens) - 1
            kv.drop(seq, start, -1)                  # the last held token decodes again: the logits to sample from
            generated = list(resume.tokens[len(tokens):])
            for token in generated:
                reply.add(token)
        try:
            rt.decode([*tokens, *generated][start:], seq, start, cancel=cancel, chunk=prefill_chunk)
        except Cancelled:
            _hold(kv, seq, [*tokens, *generated], hold)
            return Completion("", len(tokens), 0, "cancelled", 0.0, _prefilled(kv, seq, start, len(tokens)))
        with rt.sampler(params, context, seq=seq) as sampler:
            while True:                  # ends at a stop, the end token, max_tokens (checked before a decode)
                if cancel.is_set():
                    stopped = "cancelled"
                    _hold(kv, seq, [*tokens, *generated], hold)
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
                generated.append(token)
                if len(generated) == params.max_tokens:
                    break
                try:
                    rt.decode([token], seq, len(tokens) + len(generated) - 1)
                except ContextFullError:
                    stopped = "length"
                    break
    finally:
        kv.drop(seq)
    rest = reply.finish() if stopped != "stop" else ""
    if rest and on_token is not None:
        on_token(rest)
    return Completion(reply.text, len(tokens), len(generated), stopped, ttft,
                      None if start == 0 else max(0, len(tokens) - start))


def _resumable(held: HeldCompletion, tokens: list[int]) -> bool:
    """Whether `held` went on from this prompt (its first tokens are the prompt's, or the prompt and a reply)."""
    n = min(len(held.tokens), len(tokens))
    return n > 0 and list(held.tokens[:n]) == tokens[:n]


def _hold(kv, seq: int, decoded: list[int], hold: Callable[[HeldCompletion], None] | None) -> None:
    """Hand `hold` the cells `seq` holds (the first `pos_max + 1` of `decoded`), when there are any."""
    n = kv.pos_max(seq) + 1
    if hold is not None and n > 0:
        hold(HeldCompletion(tuple(decoded[:n]), kv.hold_cells(seq)))


def _prefilled(kv, seq: int, start: int, prompt: int) -> int:
    """Prompt tokens a call cut in its prefill decoded (from `start`)."""
    return max(0, min(kv.pos_max(seq) + 1, prompt) - start)
