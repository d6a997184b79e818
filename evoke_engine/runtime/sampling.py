"""Sampling parameters and llama.cpp's own sampler chain built from them.

Invariant: temperature 0 is greedy (deterministic); every chain is freed by its owner
(`SamplerChain` is a context manager); `from_settings` reads a frozen Settings, so any thread may build params.
A chain is built per reply, so its grammar (GBNF, llama.cpp's grammar sampler) constrains the reply only;
penalties, logit biases, top-k and min-p are llama.cpp's own samplers, never re-implemented here.
"""

from __future__ import annotations

import ctypes
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import llama_cpp as ll
import numpy as np

from ..settings import Settings


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    seed: int = -1
    max_tokens: int = 1024
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False       # end-of-generation tokens never sampled: exactly max_tokens (benches)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()     # (token id, bias added to its logit)
    grammar: str | None = None     # GBNF with a `root` rule: the reply must match it
    logprobs: int = -1             # >= 0: report each sampled token's log-probability and this many alternatives
    on_logprobs: Callable[[dict], None] | None = field(default=None, compare=False)   # receives each report

    @classmethod
    def from_settings(cls, s: Settings, **overrides) -> SamplingParams:
        values = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                      repeat_penalty=s.repeat_penalty, seed=s.seed, max_tokens=s.max_tokens, ignore_eos=False)
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in values and key not in _OPTIONAL:
                raise TypeError(f"unknown sampling parameter {key!r}")
            values[key] = tuple(value) if key == "stop" else (
                tuple((int(t), float(b)) for t, b in value) if key == "logit_bias" else value)
        if values["max_tokens"] < 1:
            raise ValueError("max_tokens must be at least 1")
        return cls(**values)


def json_grammar() -> str:
    """llama-cpp-python's GBNF for any JSON object (`response_format: json_object`)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def json_schema_grammar(schema_json: str) -> str:
    """llama-cpp-python's own JSON-schema → GBNF converter (it raises bare exceptions on what it cannot express)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return json_schema_to_gbnf(schema_json)


class GrammarError(ValueError):
    """A grammar llama.cpp's parser refused (the request's fault, not the engine's)."""


_OPTIONAL = ("stop", "presence_penalty", "frequency_penalty", "logit_bias", "grammar", "logprobs",
             "on_logprobs")
_EOG_TOKENS: dict[tuple[int, int], tuple[int, ...]] = {}


def _eog_tokens(ctx, n_vocab: int) -> tuple[int, ...]:
    """The vocabulary's end-of-generation tokens (one scan per model, as llama-server's ignore_eos)."""
    model = ll.llama_get_model(ctx)
    key = (ctypes.cast(model, ctypes.c_void_p).value or 0, n_vocab)
    if key not in _EOG_TOKENS:
        vocab = ll.llama_model_get_vocab(model)
        _EOG_TOKENS[key] = tuple(t for t in range(n_vocab) if ll.llama_vocab_is_eog(vocab, t))
    return _EOG_TOKENS[key]


def _piece(vocab, token: int) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = ll.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    return buf.raw[:max(n, 0)]


class SamplerChain:
    def __init__(self, params: SamplingParams, ctx, n_vocab: int) -> None:
        self.ctx = ctx
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        if params.grammar:
            vocab = ll.llama_model_get_vocab(ll.llama_get_model(ctx))
            grammar = ll.llama_sampler_init_grammar(vocab, params.grammar.encode(), b"root")
            if not grammar:
                ll.llama_sampler_free(chain)
                raise GrammarError("the grammar does not parse (GBNF with a `root` rule)")
            add(grammar)
        if params.logit_bias:
            pairs = [(t, b) for t, b in params.logit_bias if 0 <= t < n_vocab]
            biases = (ll.llama_logit_bias * len(pairs))(*pairs)
            add(ll.llama_sampler_init_logit_bias(n_vocab, len(pairs), biases))
        if params.ignore_eos:
            banned = _eog_tokens(ctx, n_vocab)
            biases = (ll.llama_logit_bias * len(banned))(*((t, float("-inf")) for t in banned))
            add(ll.llama_sampler_init_logit_bias(n_vocab, len(banned), biases))
        if params.repeat_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            add(ll.llama_sampler_init_penalties(n_vocab, 64, params.repeat_penalty, params.frequency_penalty,
                                                params.presence_penalty))
        if params.temperature <= 0:
            add(ll.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(ll.llama_sampler_init_top_k(params.top_k))
            add(ll.llama_sampler_init_top_p(params.top_p, 1))
            add(ll.llama_sampler_init_min_p(params.min_p, 1))
            add(ll.llama_sampler_init_temp(params.temperature))
            seed = params.seed if params.seed >= 0 else random.getrandbits(32)
            add(ll.llama_sampler_init_dist(seed))
        self.chain = chain
        self.n_vocab = n_vocab
        self.top_logprobs = params.logprobs
        self.on_logprobs = params.on_logprobs if params.logprobs >= 0 else None
        self._sampled: tuple[int, dict | None] | None = None     # taken at a shared step, handed out by `sample`
        self.on_close: Callable[[], None] | None = None           # the runtime forgets the chain (`Runtime.sampler`)

    def sample(self) -> int:
        """Sample from the last decoded token's logits and accept the choice (and report its log-probability); after
        a shared step (`presample`), the token sampled from this reply's row then."""
        if self._sampled is not None:
            (token, report), self._sampled = self._sampled, None
        else:
            token = ll.llama_sampler_sample(self.chain, self.ctx, -1)
            report = self._report(token, -1) if self.on_logprobs is not None else None
        if report is not None:
            self.on_logprobs(report)
        return token

    def presample(self, row: int) -> None:
        """Sample now from logits row `row` of a decode shared with other replies (`StepBatch`), before another
        decode overwrites it; the reply's next `sample()` returns the token (and reports it, on its own thread)."""
        token = ll.llama_sampler_sample(self.chain, self.ctx, row)
        self._sampled = token, (self._report(token, row) if self.on_logprobs is not None else None)

    def _report(self, token: int, row: int) -> dict | None:
        """The sampled token's log-probability under the model (log-softmax of its logits) and the most likely
        alternatives, OpenAI's `logprobs.content[i]` shape; end-of-generation tokens are not part of the text."""
        vocab = ll.llama_model_get_vocab(ll.llama_get_model(self.ctx))
        if ll.llama_vocab_is_eog(vocab, token):
            return None
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,)).astype(np.float64)
        peak = float(logits.max())
        logprobs = logits - (peak + math.log(float(np.exp(logits - peak).sum())))
        top = np.argsort(-logprobs)[:self.top_logprobs] if self.top_logprobs > 0 else []

        def entry(t: int) -> dict:
            raw = _piece(vocab, int(t))
            return {"token": raw.decode("utf-8", "replace"), "logprob": float(logprobs[t]), "bytes": list(raw)}

        return {**entry(token), "top_logprobs": [entry(t) for t in top]}

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
            self.on_close = None
        if self.chain is not None:
            ll.llama_sampler_free(self.chain)
            self.chain = None

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
