"""Sampling parameters and llama.cpp's own sampler chain built from them.

Invariant: temperature 0 is greedy (deterministic); every chain is freed by its owner
(`SamplerChain` is a context manager); `from_settings` reads a frozen Settings, so any thread may build params.
"""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass, field

import llama_cpp as ll

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

    @classmethod
    def from_settings(cls, s: Settings, **overrides) -> SamplingParams:
        values = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                      repeat_penalty=s.repeat_penalty, seed=s.seed, max_tokens=s.max_tokens, ignore_eos=False)
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in values and key != "stop":
                raise TypeError(f"unknown sampling parameter {key!r}")
            values[key] = tuple(value) if key == "stop" else value
        if values["max_tokens"] < 1:
            raise ValueError("max_tokens must be at least 1")
        return cls(**values)


_EOG_TOKENS: dict[tuple[int, int], tuple[int, ...]] = {}


def _eog_tokens(ctx, n_vocab: int) -> tuple[int, ...]:
    """The vocabulary's end-of-generation tokens (one scan per model, as llama-server's ignore_eos)."""
    model = ll.llama_get_model(ctx)
    key = (ctypes.cast(model, ctypes.c_void_p).value or 0, n_vocab)
    if key not in _EOG_TOKENS:
        vocab = ll.llama_model_get_vocab(model)
        _EOG_TOKENS[key] = tuple(t for t in range(n_vocab) if ll.llama_vocab_is_eog(vocab, t))
    return _EOG_TOKENS[key]


class SamplerChain:
    def __init__(self, params: SamplingParams, ctx, n_vocab: int) -> None:
        self.ctx = ctx
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        if params.ignore_eos:
            banned = _eog_tokens(ctx, n_vocab)
            biases = (ll.llama_logit_bias * len(banned))(*((t, float("-inf")) for t in banned))
            add(ll.llama_sampler_init_logit_bias(n_vocab, len(banned), biases))
        if params.repeat_penalty != 1.0:
            add(ll.llama_sampler_init_penalties(n_vocab, 64, params.repeat_penalty, 0.0, 0.0))
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

    def sample(self) -> int:
        """Sample from the last decoded token's logits and accept the choice."""
        return ll.llama_sampler_sample(self.chain, self.ctx, -1)

    def close(self) -> None:
        if self.chain is not None:
            ll.llama_sampler_free(self.chain)
            self.chain = None

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
