"""What a loaded model is built on: the runtime (tokenizer, decode, contexts), its KV primitives and its sampler,
as one value a `Backend` opens, and the vocabulary-only copy the endpoint counts with off the engine thread
(issue 47's seam, as SGLang's `RadixCache.create_simulated` takes a mock allocator).

`LLAMA_CPP` (llama.cpp in-process: `Runtime`, `KVCache`, the attention capture) is the default everywhere; a
simulated backend (the lab's `benchmarks/kv_sim.py`, tests/helpers/sim_backend.py) lets a whole `Engine` run
without a model, to test the engine's own logic: lifecycle, persistence, rebuild, rollback, editing, sessions.

The sampler travels with the runtime: `rt.sampler(params, context)` gives llama.cpp's chain over that context's
logits (`Runtime`), or a simulated runtime's own.

Invariants: `open` returns a whole `BackendParts` or frees what it made and raises (an `EvokeError` from the
runtime's own load after a LOAD_FAILED event); `BackendParts.close` frees the runtime, then the attention capture
the runtime's contexts called into.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import EvokeError
from ..events import EngineEvent, EventKind
from ..settings import Settings
from .attention import AttentionCapture, attach_capture
from .kv import KVCache, KVPrimitives
from .runtime import Runtime
from .vocab import VocabCounter


@dataclass(eq=False)
class BackendParts:
    """One model's runtime (`Runtime` or one with its public surface), KV primitives and attention capture."""
    rt: Runtime
    kv: KVPrimitives
    attention: AttentionCapture | None = None

    def close(self) -> None:
        self.rt.close()
        if self.attention is not None:
            self.attention.close()


class Backend(Protocol):
    def open(self, settings: Settings, emit: Callable[[EngineEvent], None]) -> BackendParts:
        """Load the model `settings` names (engine thread)."""
        ...

    def vocabulary(self, model_path: Path) -> VocabCounter:
        """A vocabulary-only copy of the model at `model_path` (any thread; the endpoint's counts)."""
        ...


class LlamaCppBackend:
    """llama.cpp in-process: the model and its contexts, `KVCache` over them, the attention capture if asked."""

    def open(self, settings: Settings, emit: Callable[[EngineEvent], None]) -> BackendParts:
        capture = AttentionCapture.create(gqa=settings.attention_gqa) if settings.attention_capture else None
        try:
            rt = Runtime(settings, eval_callback=capture)
        except EvokeError as exc:
            emit(EngineEvent(EventKind.LOAD_FAILED, str(exc)))
            raise
        attention = None
        try:
            attention = attach_capture(capture, rt, settings, emit)
            return BackendParts(rt=rt, kv=KVCache(rt, mirror=attention), attention=attention)
        except BaseException:
            BackendParts(rt=rt, kv=None, attention=attention).close()  # type: ignore[arg-type]
            raise

    def vocabulary(self, model_path: Path) -> VocabCounter:
        return VocabCounter(model_path)


LLAMA_CPP: Backend = LlamaCppBackend()
