"""The one llama.cpp model and its contexts: load, tokenize, decode in chunks, sample.

Invariants: every method runs on the thread that constructed the Runtime (asserted, so a
call from the GUI thread fails loudly), and every `llama_decode` on the process's one compute
thread (`compute_thread`: one OpenMP team keeps spinning); a decode never mixes sequences unless asked. Sequences:
one per slot, the prefixes, one scratch, one for a raw completion. The slot layout (`slot_layout`) says where they live:
`streams` (the default where the direct KV path runs): one context whose cache keeps a KV stream per
slot, so a reply attends over its own conversation only and the replies' tokens share one decode;
`contexts`: a context per slot, replies take turns; with either, the prefixes and the scratch live in
a context of their own (a slot's size) and reach a slot as a byte copy, so every slot holds its
conversation at the same cells. `unified`: one context holds every sequence.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll
import numpy as np

from ..errors import Cancelled, DecodeError, ModelLoadError
from ..settings import Settings
from . import compute_thread, device, fit, kv_direct, rpc, rpc_placement
from .decode_pace import DecodePace
from .model_file import (  # noqa: F401 - re-exported: callers import these from runtime
    GGUF_MAGIC,
    check_model_file,
    cpu_has_amx,
    default_model_path,
    quiet_llama_logs,
    resolve_flash_attention,
    safe_model_params,
)
from .sampling import SamplerChain, SamplingParams
from .step_batch import StepBatch, StepToken
from .tokens import tokenize_with

log = logging.getLogger(__name__)

PREFIX_SEQS = 2
_KV_TYPES = {"f16": ll.GGML_TYPE_F16, "q8_0": ll.GGML_TYPE_Q8_0}
_FLASH = {"auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
          "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    description: str
    n_params: int
    size_bytes: int
    n_layer: int
    n_ctx: int
    n_ctx_train: int
    architecture: str            # GGUF general.architecture ("llama", "qwen2", ...)
    device: str                  # "CUDA0 (NVIDIA GeForce RTX 4090)" or "CPU (...)"
    device_kind: str             # "cuda" or "cpu"
    device_notice: str           # why a CUDA build runs on the CPU, else ""
    n_gpu_layers: int            # layers whose weights (and KV) live on the GPU
    vram_weights_bytes: int
    vram_kv_bytes: int
    vram_total_bytes: int
    vram_free_bytes: int         # when the model was loaded
    kv_cache_type: str
    kv_bytes_per_token: int
    flash_attention: str         # "on" or "off", as resolved
    contexts: int                # llama.cpp contexts (one per slot, or one for all)
    eviction_supported: bool
    eviction_note: str
    devices: tuple[rpc_placement.DeviceShare, ...] = ()   # with remote devices: each device, its memory and layers
    gpu_layers_reason: str = ""   # the GPU layers chosen and why ("auto: 20 of 64 layers on the GPU, ...")
    slot_layout: str = "unified"  # where the slots' K/V live: streams, contexts or unified (Settings.slot_layout)
    slot_layout_note: str = ""    # why the layout is not the one asked for, else ""


class Runtime:
    """Owns the llama.cpp model, context, vocabulary and a reusable batch."""

    def __init__(self, settings: Settings, *, eval_callback=None) -> None:
        """`eval_callback`: an object with `cb_eval` (a ggml_backend_sched_eval_callback) and `user_data`,
        installed on the context and kept alive with it (the attention capture)."""
        self.owner = threading.current_thread()
        # who may touch the context: the creating thread, unless the engine widens it to any thread holding it
        self.holds_engine: Callable[[], bool] = lambda: threading.current_thread() is self.owner
        # called by a reply between two of its steps (a prefill block, a token): the engine lets other replies
        # and jobs run there (`EngineThread.step_boundary`); a no-op until the engine installs it. Never between a
        # decode and the sample that reads its logits: another context's work may decode in this one (context 0
        # holds the prefixes and the scratch sequence), and a context has one logits buffer
        self.step_boundary: Callable[[], None] = lambda: None
        # the step boundary before a reply's next token (`EngineThread.token_boundary`: its first token is out)
        self.token_boundary: Callable[[], None] = lambda: self.step_boundary()
        # a step boundary only where the running step has taken a token step's time (`EngineThread.boundary_if_spent`)
        self.boundary_if_spent: Callable[[], None] = lambda: self.step_boundary()
        self.pace = DecodePace()                # how long a reply's token step and a prompt token take here
        # while other work waits: the most tokens a slot sequence's decode runs before a step boundary (0: no split)
        self.step_tokens: Callable[[], int] = lambda: 0
        # a reply's next token joins the step other replies share (`StepBatch`) when `joins_step()` says one will
        # run; `await_step()` parks the reply until the engine has run it (`run_step`). Until the engine installs
        # them, every token is decoded alone
        self.joins_step: Callable[[], bool] = lambda: False
        self.await_step: Callable[[], None] = lambda: None
        self.settings = settings
        path = Path(settings.model_path) if settings.model_path else default_model_path()
        check_model_file(path)
        self.model_path = path
        # Sequences: one per slot, PREFIX_SEQS shared prefixes, one scratch sequence, then the raw completion's
        self.prefix_seqs = list(range(settings.slots, settings.slots + PREFIX_SEQS))
        self.scratch_seq = settings.slots + PREFIX_SEQS
        self.completion_seq = self.scratch_seq + 1
        self.n_seq_max = self.completion_seq + 1

        quiet_llama_logs()
        self.device = device.detect()
        ll.llama_backend_init()
        mparams = safe_model_params()
        self.remote_watch: rpc.RemoteWatch | None = None
        self.layer_choice = fit.choose_gpu_layers(settings, self.device, path)     # before the load takes memory
        self.placement = rpc_placement.plan(settings, self.device, path, self.layer_choice.n_gpu_layers)
        self.placement.apply(mparams)
        self.model = ll.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            remote = ", ".join(self.placement.endpoints)
            where = f" across {remote} and this machine" if remote else ""
            raise ModelLoadError(f"llama.cpp could not load the model{where} (corrupt or unsupported GGUF, or a "
                                 f"device without room): {path}")
        self.vocab = ll.llama_model_get_vocab(self.model)

        self.flash_attention = resolve_flash_attention(settings.flash_attention, settings.kv_cache_type,
                                                       self.device.on_gpu)
        self.layout, self.layout_note = self._choose_layout(settings, eval_callback)
        threads = settings.n_threads or device.auto_threads()
        self._eval_callback = eval_callback
        self.before_decode = None           # called with the sequence before each decode (the capture's target)
        # the slots' cells: each slot's share of n_ctx (its stream or its context), or all of it shared (unified)
        self.slot_cells = settings.n_ctx // (1 if self.layout == "unified" else settings.slots)
        if self.layout == "streams":        # one context, a stream per slot; the prefixes' context after it
            shapes = [(settings.n_ctx, settings.slots, False), (self.slot_cells, self.n_seq_max, True)]
        elif self.layout == "contexts":     # a context per slot, then the prefixes' context
            shapes = [(self.slot_cells, self.n_seq_max, True)] * (settings.slots + 1)
        else:
            shapes = [(settings.n_ctx, self.n_seq_max, True)]
        self.contexts: list = []            # llama_context pointers
        for n_ctx, n_seq, unified in shapes:
            cparams = self._context_params(settings, n_ctx, n_seq, unified, threads)
            ctx = ll.llama_init_from_model(self.model, cparams)
            if not ctx:
                self.close()
                raise ModelLoadError(
                    f"llama.cpp could not create a context of {cparams.n_ctx} tokens "
                    f"(out of memory? try a smaller context or KV cache type q8_0): {path}")
            self.contexts.append(ctx)
        self.n_contexts = len(self.contexts)
        self.prefix_context = 0 if self.layout == "unified" else self.n_contexts - 1
        self._memories = [ll.llama_get_memory(ctx) for ctx in self.contexts]
        if self.placement.endpoints:        # llama.cpp's connections to the workers exist now: watch them
            self.remote_watch = rpc.RemoteWatch(self.placement.endpoints)
        # what one conversation's sequence can hold (llama.cpp pads a stream or a context to 256 cells)
        self.slot_cells = ll.llama_n_ctx_seq(self.contexts[0])
        self.n_ctx_per_context = self.slot_cells
        self.n_ctx = self.slot_cells * (1 if self.layout == "unified" else settings.slots)
        self._last_context = 0
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self._batch_capacity = settings.n_batch
        self._batch = ll.llama_batch_init(self._batch_capacity, 0, self.n_seq_max)
        self.step_batch = StepBatch(self._batch_capacity, self.n_seq_max)
        self.step_batch.fill_gaps = self.device.on_gpu and self.gpu_layers() > 0
        self.eviction_note = self._detect_cache_kind()
        self.eviction_supported = self.eviction_note == ""
        self._token_piece_cache: dict[int, bytes] = {}
        if self.device.on_gpu:
            self.device = device.detect()          # free VRAM now that weights and KV are placed

    def _context_params(self, settings: Settings, n_ctx: int, n_seq: int, unified: bool, threads: int):
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = n_seq
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.type_k = _KV_TYPES[settings.kv_cache_type]
        cparams.type_v = _KV_TYPES[settings.kv_cache_type]
        cparams.flash_attn_type = _FLASH[self.flash_attention]
        cparams.kv_unified = unified
        cparams.no_perf = True
        if self._eval_callback is not None:
            cparams.cb_eval, cparams.cb_eval_user_data = self._eval_callback.cb_eval, self._eval_callback.user_data
        return cparams

    def _choose_layout(self, settings: Settings, eval_callback) -> tuple[str, str]:
        """The slot layout to build and, where it is not the one asked for, why. A stream per slot needs the direct
        KV path (a block spliced into a sequence that already holds others: llama.cpp's own state path clears the
        sequence it reads into, and a sequence copy between streams copies a whole stream)."""
        asked = settings.slot_layout
        if asked != "streams":
            return asked, ""
        why, cache_note = "", self._detect_cache_kind()
        if not settings.kv_direct:
            why = "the direct KV path is off (kv_direct)"
        elif not kv_direct.available():
            why = f"the direct KV library is {kv_direct.missing_note()}"
        elif eval_callback is not None:
            why = "the attention capture reads one stream"
        elif settings.rpc_servers:
            why = "the model is split over RPC workers"
        elif cache_note:
            why = cache_note
        if why:
            log.info("a context per slot instead of a KV stream per slot: %s", why)
            return "contexts", f"a context per slot: {why}"
        return "streams", ""

    @staticmethod
    def gpu_layers_requested(settings: Settings, dev: device.DeviceInfo) -> int:
        """llama.cpp's n_gpu_layers for a load now: none on the CPU, the setting's number, or (`auto`, the
        default) as many as fit the free GPU memory (fit.choose_gpu_layers)."""
        path = Path(settings.model_path) if settings.model_path else default_model_path()
        return fit.choose_gpu_layers(settings, dev, path).n_gpu_layers

    def gpu_layers(self) -> int:
        """Repeating layers placed on the GPU (the first offloaded slot is the output layer, past n_layer)."""
        return fit.layers_on_gpu(ll.llama_model_n_layer(self.model), self.layer_choice.n_gpu_layers)

    # -- contexts ---------------------------------------------------------------------------
    def context_of(self, seq: int) -> int:
        """The context a sequence lives in: a slot's is the streams' context (0) or its own; the prefixes' and the
        scratch's is their own context (the last); with `unified`, 0 for all."""
        if seq >= self.settings.slots:
            return self.prefix_context
        return seq if self.layout == "contexts" else 0

    def same_cells(self, a: int, b: int) -> bool:
        """Whether two sequences can share cells (a sequence copy, no bytes moved): one context, one stream."""
        if self.context_of(a) != self.context_of(b):
            return False
        return self.layout != "streams" or a == b or min(a, b) >= self.settings.slots

    def streams_in(self, seq: int) -> bool:
        """Whether `seq` is a stream's own (a slot's reply, a raw completion): its long decodes split into steps."""
        return seq < self.settings.slots or seq == self.completion_seq

    def has_scratch(self, context: int) -> bool:
        """Whether the scratch sequence can serve `context` (every context but the streams' one: there a sequence
        copy between two streams would copy a whole stream)."""
        return not (self.layout == "streams" and context == 0)

    @property
    def slot_runs_batch(self) -> bool:
        """Whether a step decodes each run of consecutive slots as one ubatch, a pass over the weights a run (the KV
        streams layout, llama.cpp's split_equal): there replies decoding in adjacent slots cost one pass."""
        return self.layout == "streams"

    @property
    def slots_share_cells(self) -> bool:
        """Whether the slots and the prefixes share one cache (`unified`); else a prefix reaches a slot as bytes."""
        return self.layout == "unified"

    @property
    def steps_shared(self) -> bool:
        """Whether the replies' next tokens can share one decode (every slot in one context)."""
        return self.layout in ("streams", "unified")

    def ctx(self, context: int):
        """A context, for a call that computes or moves K/V bytes: RemoteDeviceLost once a worker has gone
        (llama.cpp's RPC client would abort the process on the lost connection)."""
        if self.remote_watch is not None:
            self.remote_watch.check()
        return self.contexts[context]

    def memory(self, context: int):
        return self._memories[context]

    def sampler(self, params: SamplingParams, context: int, *, seq: int | None = None) -> SamplerChain:
        """llama.cpp's sampler chain over `context`'s logits (a `with` block frees it). With `seq` (a reply's
        slot sequence), the reply's next tokens may join a shared step, which samples them with this chain."""
        chain = SamplerChain(params, self.ctx(context), self.n_vocab)
        if seq is not None:
            self.step_batch.samplers[seq] = chain
            chain.on_close = lambda: self.step_batch.samplers.pop(seq, None)
        return chain

    @property
    def last_ctx(self):
        """The context of the last decode (whose logits the sampler reads)."""
        return self.contexts[self._last_context]

    # -- identity ---------------------------------------------------------------------------
    def _check_thread(self) -> None:
        if not self.holds_engine():
            raise RuntimeError(f"llama.cpp called from thread {threading.current_thread().name!r}, which does not "
                               "hold the engine; only the engine thread and its replies' streams may touch the context")

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def _detect_cache_kind(self) -> str:
        """'' when the cache supports block eviction, else why not (recurrent, hybrid, SWA)."""
        if ll.llama_model_is_recurrent(self.model):
            return "recurrent model (state, not per-token KV): eviction disabled"
        if hasattr(ll, "llama_model_is_hybrid") and ll.llama_model_is_hybrid(self.model):
            return "hybrid recurrent/attention model: eviction disabled"
        if ll.llama_model_n_swa(self.model) > 0:
            return "sliding-window attention cache: eviction disabled"
        rope = ll.llama_model_rope_type(self.model)
        if rope == ll.LLAMA_ROPE_TYPE_NONE:
            return "model without RoPE: re-anchoring impossible, eviction disabled"
        return ""

    def info(self) -> ModelInfo:
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model, desc, len(desc))
        n_layer = ll.llama_model_n_layer(self.model)
        on_gpu = self.gpu_layers()
        share = on_gpu / max(1, n_layer)
        return ModelInfo(
            path=str(self.model_path),
            name=self.meta("general.name") or self.model_path.stem,
            description=desc.value.decode("utf-8", "replace"),
            n_params=ll.llama_model_n_params(self.model),
            size_bytes=ll.llama_model_size(self.model),
            n_layer=n_layer,
            n_ctx=self.n_ctx,
            n_ctx_train=ll.llama_model_n_ctx_train(self.model),
            architecture=self.meta("general.architecture") or "",
            device=self.device.label(),
            device_kind=self.device.kind,
            device_notice="; ".join(filter(None, [self.device.notice, *self.placement.notices])),
            n_gpu_layers=on_gpu,
            vram_weights_bytes=int(ll.llama_model_size(self.model) * share),
            vram_kv_bytes=int(self.n_ctx * self.kv_bytes_per_token() * share),
            vram_total_bytes=self.device.vram_total_bytes,
            vram_free_bytes=self.device.vram_free_bytes,
            kv_cache_type=self.settings.kv_cache_type,
            kv_bytes_per_token=self.kv_bytes_per_token(),
            flash_attention=self.flash_attention,
            contexts=self.n_contexts,
            slot_layout=self.layout,
            slot_layout_note=self.layout_note,
            eviction_supported=self.eviction_supported,
            eviction_note=self.eviction_note,
            devices=self.placement.shares,
            gpu_layers_reason=self.layer_choice.reason,
        )

    def kv_bytes_per_token(self) -> int:
        n_layer = ll.llama_model_n_layer(self.model)
        n_embd = ll.llama_model_n_embd(self.model)
        n_head = max(1, ll.llama_model_n_head(self.model))
        n_head_kv = max(1, ll.llama_model_n_head_kv(self.model))
        kv_dim = n_embd // n_head * n_head_kv
        per_value = 2.0 if self.settings.kv_cache_type == "f16" else 34 / 32
        return int(2 * n_layer * kv_dim * per_value)

    # -- text -------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        self._check_thread()
        return tokenize_with(self.vocab, text, add_special, parse_special)

    def tokenize_parts(self, parts: Iterable[tuple[str, bool]]) -> list[int]:
        """Tokens of (text, special) pieces in order: only pieces marked special may yield special tokens
        (the template's markup); the rest (what a user, a file, a tool or a reply wrote) is plain text."""
        return [t for text, special in parts if text for t in self.tokenize(text, parse_special=special)]

    def token_bytes(self, token: int) -> bytes:
        piece = self._token_piece_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._token_piece_cache[token] = piece
        return piece

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, key: str) -> str:
        """The text of a special token named in metadata (bos / eos), or ''."""
        getter = {"bos": ll.llama_vocab_bos, "eos": ll.llama_vocab_eos}[key]
        token = getter(self.vocab)
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:max(n, 0)].decode("utf-8", "replace")

    # -- decode -----------------------------------------------------------------------------
    def decode(self, tokens: list[int], seq: int, start_pos: int, *, logits_last: bool = True,
               cancel: threading.Event | None = None, on_chunk=None, context: int | None = None,
               logits_all: bool = False, chunk: int = 0) -> None:
        """Decode `tokens` into `seq` at positions start_pos.., in chunks of n_batch (or of `chunk`, where a
        background job's prefill reads `cancel` that often), in the sequence's
        context (or `context`, for the scratch sequence serving another context). `logits_all`: every token
        of the last chunk has its logits row (`logits(i)`; a scorer's tokens fit one chunk). Into a slot's own
        sequence, while other work waits, the chunks are at most `step_tokens()` long with a step boundary
        between them (chunked prefill: another reply's token waits for one chunk, not the whole message).

        Raises DecodeError when the context has no room. `on_chunk(done)` is told progress.
        """
        self._check_thread()
        if (len(tokens) == 1 and logits_last and not logits_all and context is None and on_chunk is None
                and seq in self.step_batch.samplers):
            self._decode_next_token(tokens[0], seq, start_pos, cancel)
            return
        batch = self._batch
        context = self.context_of(seq) if context is None else context
        ctx = self.ctx(context)
        self._last_context = context
        total = len(tokens)
        if self.before_decode is not None:
            self.before_decode(seq)
        done = 0
        own_stream = self.streams_in(seq)              # not a shared prefix nor the scratch: only its stream reads it
        while done < total:
            if done and own_stream:
                self.step_boundary()                   # a long prefill lets the other replies take their steps
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            step = self.step_tokens() if own_stream and not logits_all else 0
            n = min(self._batch_capacity, total - done, step or total, chunk or total)
            for i in range(n):
                batch.token[i] = tokens[done + i]
                batch.pos[i] = start_pos + done + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = int(logits_all)
            if logits_last and done + n == total:
                batch.logits[n - 1] = 1
            batch.n_tokens = n
            began = time.perf_counter()
            rc = compute_thread.llama_decode(ctx, batch)
            if rc != 0:
                raise DecodeError(rc, self.n_ctx_per_context)
            if own_stream:
                self.pace.prompt_chunk(n, time.perf_counter() - began)
            done += n
            if self.remote_watch is not None and done < total:
                self.remote_watch.check()
            if on_chunk is not None:
                on_chunk(done)

    def _decode_next_token(self, token: int, seq: int, pos: int, cancel: threading.Event | None) -> None:
        """A streaming reply's next token, its step point: other replies and jobs run before it; where a shared
        step will run (the slots' context, other replies decoding), the token joins it and the reply's sampler
        samples its row there, else (a context a slot, a raw completion in the prefixes' context) it is decoded
        alone."""
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        if self.steps_shared and self.context_of(seq) == 0 and self.joins_step():
            entry = StepToken(seq, token, pos)
            self.step_batch.add(entry)
            self.await_step()
            if entry.failure is not None:
                raise entry.failure
            return
        self.token_boundary()
        context = self.context_of(seq)
        self._last_context = context
        if self.before_decode is not None:
            self.before_decode(seq)
        batch = self._batch
        batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = token, pos, 1, 1
        batch.seq_id[0][0] = seq
        batch.n_tokens = 1
        began = time.perf_counter()
        rc = compute_thread.llama_decode(self.ctx(context), batch)
        if rc != 0:
            raise DecodeError(rc, self.n_ctx_per_context)
        self.pace.token_step(time.perf_counter() - began)

    def run_step(self) -> None:
        """The shared step: every waiting reply's token in one decode, each sampled from its own row (called by the
        engine while those replies are parked)."""
        self._check_thread()
        self._last_context = 0
        if self.before_decode is not None:
            for entry in self.step_batch.waiting:
                self.before_decode(entry.seq)
        streams = self.memory(0) if self.layout == "streams" else None
        began = time.perf_counter()
        self.step_batch.run(self.ctx(0), self.n_ctx_per_context, streams_memory=streams)
        self.pace.token_step(time.perf_counter() - began)

    def logits(self, index: int = -1) -> np.ndarray:
        """Copy of the logits row of the last decoded token (or batch row `index`)."""
        self._check_thread()
        ptr = ll.llama_get_logits_ith(self.last_ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        watch = getattr(self, "remote_watch", None)
        if watch is not None and watch.lost:
            # Freeing would send llama.cpp's RPC client to the lost worker, and it aborts the process when it
            # cannot: the model, its contexts and its batch are left allocated until the process ends.
            log.warning("leaving the model allocated: its remote device(s) %s went away", ", ".join(watch.lost))
            self.contexts, self._batch, self.model = [], None, None
            return
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "step_batch", None) is not None:
            self.step_batch.close()
        for ctx in getattr(self, "contexts", []):
            ll.llama_free(ctx)
        self.contexts = []
        if getattr(self, "model", None):
            ll.llama_model_free(self.model)
            self.model = None


__all__ = ["Runtime", "ModelInfo", "Cancelled", "DecodeError",
           "default_model_path", "check_model_file"]
