"""A simulated backend (`evoke_engine.runtime.backend.Backend`) so a whole `Engine` runs without a model.

Owns nothing of the engine: the lab's simulated KV cache and runtime (`benchmarks/kv_sim.py`: cells, positions,
sequences, saved bytes, a toy word-level vocabulary) plus what a loaded model also answers (its file, context
size, metadata, `ModelInfo`) and a scripted sampler: each reply is the next text the backend was given (then
"reply N.") as toy words, then end-of-generation; an exception given instead is raised by the sampler (a turn
that fails). The chat template is ChatML (no template in the metadata). Every runtime the backend opens shares one
vocabulary, as reloads of one model file do, so a KV file written by one engine reads in the next.

What it is for: the engine's own logic end to end (lifecycle, persistence, rebuild, rollback, editing, the
endpoint's sessions) in milliseconds. It proves nothing about llama.cpp: what only llama.cpp can show stays in
tests/integration.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from evoke_engine import Engine, EngineEvent
from evoke_engine.runtime.backend import BackendParts
from evoke_engine.runtime.runtime import PREFIX_SEQS, ModelInfo
from evoke_engine.runtime.template import ChatTemplate
from evoke_engine.settings import Settings

from .fake_kv import FakeKVCache, FakeRuntime, ToyVocab


class ScriptedSampler:
    """Hands out one reply's tokens, then end-of-generation forever (a turn stops at the first); with `error`,
    raises it on the first sample instead."""

    def __init__(self, tokens: list[int], eos: int, error: Exception | None = None) -> None:
        self.tokens = iter(tokens)
        self.eos = eos
        self.error = error
        self.on_exit: Any = None                     # the runtime forgets the reply's sequence (`Runtime.sampler`)

    def sample(self) -> int:
        if self.error is not None:
            raise self.error
        return next(self.tokens, self.eos)

    def __enter__(self) -> ScriptedSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on_exit is not None:
            self.on_exit()


class SimRuntime(FakeRuntime):
    """`FakeRuntime` with the rest of `Runtime`'s public surface that loading and serving a model read."""

    flash_attention = "on"

    def __init__(self, settings: Settings, backend: SimBackend) -> None:
        super().__init__(slots=settings.slots, n_cells=settings.n_ctx)
        self.vocab = backend.vocab
        self.backend = backend
        self.settings = settings
        self.prefix_seqs = list(range(settings.slots, settings.slots + PREFIX_SEQS))
        self.scratch_seq = settings.slots + PREFIX_SEQS            # slots, the prefixes, then the scratch (as Runtime)
        self.completion_seq = self.scratch_seq + 1                  # and a raw completion's
        self.n_ctx = self.n_ctx_per_context = settings.n_ctx
        self.model_path = backend.model_path
        self.closed = False
        self.reply_seqs: set[int] = set()          # sequences whose reply is sampling (their token is a step point)

    def sampler(self, params: Any, context: int, *, seq: int | None = None) -> ScriptedSampler:
        """The next reply the backend was given (`Runtime.sampler`'s place: llama.cpp's chain)."""
        sampler = self.backend.next_sampler(self)
        if seq is not None:
            self.reply_seqs.add(seq)
            sampler.on_exit = lambda: self.reply_seqs.discard(seq)
        return sampler

    def decode(self, tokens: list[int], seq: int, start_pos: int, *, logits_last: bool = True, cancel=None,
               on_chunk=None, context: int | None = None, logits_all: bool = False, chunk: int = 0) -> None:
        """As `Runtime.decode`: a sampling reply's next token is its step point (the simulator has no shared step:
        replies take turns, as with a context a slot)."""
        if len(tokens) == 1 and logits_last and context is None and on_chunk is None and seq in self.reply_seqs:
            self.token_boundary()
        super().decode(tokens, seq, start_pos, logits_last=logits_last, cancel=cancel, on_chunk=on_chunk,
                       context=context)

    def meta(self, key: str) -> str | None:
        return None

    def token_text(self, key: str) -> str:
        return ""

    def info(self) -> ModelInfo:
        return ModelInfo(path=str(self.model_path), name="simulated", description="kv_sim", n_params=0,
                         size_bytes=0, n_layer=1, n_ctx=self.n_ctx, n_ctx_train=self.n_ctx, architecture="sim",
                         device="CPU (simulated)", device_kind="cpu", device_notice="", n_gpu_layers=0,
                         vram_weights_bytes=0, vram_kv_bytes=0, vram_total_bytes=0, vram_free_bytes=0,
                         kv_cache_type=self.settings.kv_cache_type, kv_bytes_per_token=0,
                         flash_attention=self.flash_attention, contexts=1, eviction_supported=True, eviction_note="")

    def close(self) -> None:
        self.closed = True


class SimBackend:
    """Opens a `SimRuntime` over a fresh simulated cache on each load; `opened` lists them (the last is live)."""

    def __init__(self, model_path: Path, replies: Iterable[str | Exception] = ()) -> None:
        self.model_path = Path(model_path)
        self.model_path.write_bytes(b"not a model: the simulated backend's stand-in file\n")
        self.vocab = ToyVocab()
        self.replies: deque[str | Exception] = deque(replies)
        self.sampled = 0                      # samplers handed out (one per reply)
        self.opened: list[SimRuntime] = []

    @property
    def rt(self) -> SimRuntime:
        return self.opened[-1]

    def script(self, *replies: str | Exception) -> None:
        """The next replies sampled, in order (an exception: that reply fails)."""
        self.replies.extend(replies)

    def next_sampler(self, rt: SimRuntime) -> ScriptedSampler:
        self.sampled += 1
        reply = self.replies.popleft() if self.replies else f"reply {self.sampled}."
        if isinstance(reply, Exception):
            return ScriptedSampler([], self.vocab.eos, error=reply)
        return ScriptedSampler(rt.tokenize(reply, parse_special=False), self.vocab.eos)

    def open(self, settings: Settings, emit: Any) -> BackendParts:
        rt = SimRuntime(settings, self)
        self.opened.append(rt)
        return BackendParts(rt=rt, kv=FakeKVCache(rt))        # type: ignore[arg-type]

    def vocabulary(self, model_path: Path) -> SimVocabulary:
        return SimVocabulary(model_path, self.vocab)


class SimVocabulary:
    """`VocabCounter`'s surface over the backend's toy vocabulary (the endpoint's counts, off the engine thread)."""

    def __init__(self, model_path: Path, vocab: ToyVocab) -> None:
        self.model_path = Path(model_path)
        self.vocab = vocab

    def count(self, text: str) -> int:
        return len(self.vocab.tokenize(text, parse_special=False))

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.vocab.tokenize(text, parse_special)

    @property
    def n_tokens(self) -> int:
        return len(self.vocab.pieces)

    def infill(self, prefix: str, suffix: str) -> list[int] | None:
        return None                                          # no fill-in-the-middle tokens

    def close(self) -> None:
        return None


# -- a whole engine on the simulator -----------------------------------------------------------------------------
SIM_SETTINGS = {"budget_tokens": 512, "block_tokens": 16, "embedder": "off", "slots": 2, "n_ctx": 8192}


def sim_settings(folder: Path, **overrides: Any) -> Settings:
    """Settings for an engine on the simulator: its home under `folder`, similarity off (no torch loads)."""
    return Settings(home=str(Path(folder) / "home"), **{**SIM_SETTINGS, **overrides})


@contextlib.contextmanager
def sim_engine(backend: SimBackend, settings: Settings) -> Iterator[tuple[Engine, list[EngineEvent]]]:
    """A whole `Engine` on `backend` (no sweeps), and every event it emits from its load on."""
    events: list[EngineEvent] = []
    engine = Engine(settings, backend=backend, scheduler=False, wait=False)
    engine.subscribe(events.append)
    try:
        engine.ready.result(timeout=30)
        yield engine, events
    finally:
        engine.close()


def slot_tokens(engine: Engine, conversation_id: str) -> list[int]:
    """The token ids in the conversation's slot, in position order (the engine idle)."""
    engine.wait_idle()
    model = engine.diagnostics()
    return model.kv.tokens(model.slots.slot_of(conversation_id))


def conversation_text(engine: Engine, conversation_id: str) -> str:
    """The slot's text after the shared system prefix (which ends at the first `<|im_end|>` line)."""
    text = engine.diagnostics().rt.detokenize(slot_tokens(engine, conversation_id))
    return text.split("<|im_end|>\n", 1)[1]


def rendered(engine: Engine, conversation_id: str, *, held_opening: bool = True) -> str:
    """What the slot must hold after the prefix: the live history through ChatML, then (after a turn) the next user
    message's opening, decoded ahead (a rebuild from history holds none)."""
    opening = "<|im_start|>user\n" if held_opening else ""
    return ChatTemplate(None).render(engine.template_history(conversation_id)) + opening
