"""Whether a model fits the device, before the download and at the load: the `n_gpu_layers` that leaves llama.cpp's
margin free on the GPU, the memory each side would use, and the decode speed to expect (`auto`, the default).

Invariants: `fit` is pure arithmetic over a `ModelShape`, a device's memory and the load's `LoadShape` (no I/O, no
llama.cpp); the layers it offloads are the most whose projected GPU use stays within free memory less the margin,
counted as llama.cpp counts them (n_layer + 1 slots, the output layer first); a user's own number is never changed.

What it weighs, after llama.cpp's `common/fit.cpp` (`common_fit_params`, behind `--fit`): per device the model's
weights, the KV cache ("context") and the compute buffers, against the device's free memory less a margin of
1 GiB (`common_params::fit_params_target`, the same for host memory on a CPU-only machine), filled back to front
with whole layers, the output layer first. fit.cpp measures each candidate with a no-alloc dry load; here the same
three parts are computed from the GGUF's header instead, so a catalogue entry can be judged before its download.
A mixture of experts is placed whole (every expert of an offloaded layer on the GPU, as llama.cpp places it without
`--n-cpu-moe` or tensor overrides) and decodes at the speed of the bytes a token reads (`active_layer_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import ModelLoadError
from ..settings import GPU_LAYERS_ALL, GPU_LAYERS_AUTO, Settings
from .gguf_shape import ModelShape, read_shape

GIB = 1 << 30
GPU_MARGIN_BYTES = 1 << 30       # fit.cpp: fit_params_target, 1024 MiB left free per device
RAM_MARGIN_BYTES = 1 << 30       # fit.cpp: the same margin against host memory when no GPU is used
# Decode reads every weight once per token, so its speed is memory bandwidth over bytes. Typical figures, used
# where the device's own are unknown: a mid-range card (RTX 4070 ~500 GB/s, 3060 ~360) and dual-channel DDR5.
DEFAULT_GPU_BANDWIDTH = 450e9
DEFAULT_RAM_BANDWIDTH = 60e9

FITS, PARTIAL, CPU, TOO_BIG = "fits", "partial", "cpu", "too_big"


class Memory(Protocol):
    """The device side of a fit (device.DeviceInfo has these)."""

    @property
    def on_gpu(self) -> bool: ...
    vram_free_bytes: int
    ram_total_bytes: int
    ram_available_bytes: int


@dataclass(frozen=True)
class LoadShape:
    """What a load asks for beyond the weights: the slots' KV cells in all (`n_ctx`, the setting), the cache type,
    the llama.cpp contexts (each reserves its own compute buffers), the batch, flash attention, and how many slots
    split `n_ctx` (`slots`; 0: one per context). With a slot layout that gives the prefixes a context of their own
    (`prefix_context`), it holds one slot's share more."""

    n_ctx: int = 16384
    kv_cache_type: str = "f16"
    contexts: int = 1
    n_batch: int = 512
    flash_attention: bool = True
    slots: int = 0
    prefix_context: bool = False

    @property
    def slot_cells(self) -> int:
        """The cells one sequence attends over: its slot's share, or all of one context's."""
        return max(1, self.n_ctx // (self.slots or self.contexts))

    @property
    def cells_per_ctx(self) -> float:
        """KV cells the load holds for each cell of `n_ctx` (the prefixes' context adds a slot's share)."""
        return 1.0 + 1.0 / (self.slots or self.contexts) if self.prefix_context else 1.0

    @property
    def cells(self) -> int:
        return int(self.n_ctx * self.cells_per_ctx)

    @classmethod
    def of(cls, settings: Settings, on_gpu: bool) -> LoadShape:
        """The load `settings` make (flash attention resolved as model_file.resolve_flash_attention does)."""
        flash = settings.flash_attention == "on" or (
            settings.flash_attention == "auto" and (on_gpu or settings.kv_cache_type != "f16"))
        if settings.slot_layout == "unified":
            return cls(settings.n_ctx, settings.kv_cache_type, 1, settings.n_batch, flash, slots=1)
        contexts = 2 if settings.slot_layout == "streams" else settings.slots + 1
        return cls(settings.n_ctx, settings.kv_cache_type, contexts, settings.n_batch, flash, slots=settings.slots,
                   prefix_context=True)


@dataclass(frozen=True)
class Fit:
    """A fit's outcome: the verdict, llama.cpp's `n_gpu_layers` for it, the projected use of each side and the
    expected decode speed (at an empty context: a full one adds its KV reads)."""

    verdict: str                  # FITS, PARTIAL, CPU (no GPU), TOO_BIG (not even RAM holds the rest)
    n_gpu_layers: int             # llama.cpp's count: the output layer, then repeating layers from the last
    n_layer: int
    gpu_bytes: int                # weights, KV and compute buffers on the GPU
    ram_bytes: int                # the rest, in RAM (token embeddings included)
    gpu_budget_bytes: int         # free VRAM less the margin (0 without a GPU)
    ram_budget_bytes: int         # available RAM less the margin (0: unknown, not checked)
    speed_vs_full: float          # decode speed relative to every layer on the GPU (1.0 when it fits)
    tokens_per_s: float           # bandwidth over the bytes a token reads, at the assumed bandwidths
    full_offload_ctx: int         # the largest n_ctx (a multiple of 256) at which every layer fits; 0: none

    @property
    def layers_on_gpu(self) -> int:
        """Repeating layers on the GPU (the first offloaded slot is the output layer)."""
        return layers_on_gpu(self.n_layer, self.n_gpu_layers)

    def label(self) -> str:
        """'fits on the GPU', 'partly offloaded (20 of 64 layers, ~35% of full-offload speed)', 'too big', ..."""
        if self.verdict == FITS:
            return "fits on the GPU"
        if self.verdict == PARTIAL:
            return (f"partly offloaded ({self.layers_on_gpu} of {self.n_layer} layers, "
                    f"~{self.speed_vs_full:.0%} of full-offload speed)")
        if self.verdict == CPU:
            return f"runs on the CPU (~{self.tokens_per_s:.0f} tokens/s)"
        return f"too big: needs {self.ram_bytes / GIB:.1f} GiB of RAM, {self.ram_budget_bytes / GIB:.1f} GiB free"


def layers_on_gpu(n_layer: int, n_gpu_layers: int) -> int:
    """Repeating layers llama.cpp places on the GPU for `n_gpu_layers` (llama-model.cpp: slots i_gpu_start..n_layer,
    slot n_layer being the output layer)."""
    return min(n_layer, max(0, n_gpu_layers - 1))


def compute_bytes(shape: ModelShape, load: LoadShape, *, layers: bool, output: bool) -> int:
    """One context's compute buffer on a device holding repeating layers (`layers`) and/or the output layer:
    ggml's allocator reuses memory, so it is the largest step's live tensors (f32), the logits of a whole batch
    (n_vocab x n_batch; llama.cpp reserves for every token an output) or a layer's attention scores (without
    flash attention, n_ctx x n_batch per head, with the mask) or feed-forward. Within a few % of llama.cpp's
    reports for SmolLM2 on the CPU (98 MiB at 8K with flash attention, 168 MiB without)."""
    if not (layers or output):
        return 0
    f32, batch = 4, load.n_batch
    stream = 4 * batch * shape.n_embd * f32                          # the residual and its normed copies
    peak = stream
    if output:
        peak = max(peak, stream + batch * shape.n_vocab * f32)
    if layers:
        ctx = load.slot_cells
        scores = 0 if load.flash_attention else ctx * batch * (shape.n_head + 1) * f32
        peak = max(peak, stream + scores, stream + 2 * batch * shape.n_ff * f32)
    return int(peak)


def fit(shape: ModelShape, device: Memory, load: LoadShape, *, gpu_bandwidth: float = DEFAULT_GPU_BANDWIDTH,
        ram_bandwidth: float = DEFAULT_RAM_BANDWIDTH) -> Fit:
    """The most layers the GPU holds with fit.cpp's margin to spare, what stays in RAM, and the verdict."""
    n_layer = shape.n_layer
    kv_layer = shape.kv_bytes_per_token_per_layer(load.kv_cache_type) * load.cells
    gpu_budget = max(0, device.vram_free_bytes - GPU_MARGIN_BYTES) if device.on_gpu else 0
    ram_free = device.ram_available_bytes or device.ram_total_bytes
    ram_budget = max(0, ram_free - RAM_MARGIN_BYTES) if ram_free else 0

    def gpu_use(ngl: int) -> int:
        if ngl == 0:
            return 0
        on_gpu = layers_on_gpu(n_layer, ngl)
        weights = shape.output_bytes + sum(shape.layer_bytes[n_layer - on_gpu:])
        compute = compute_bytes(shape, load, layers=on_gpu > 0, output=True)
        return int(weights + on_gpu * kv_layer + load.contexts * compute)

    def ram_use(ngl: int) -> int:
        on_cpu = n_layer - layers_on_gpu(n_layer, ngl)
        weights = shape.input_bytes + sum(shape.layer_bytes[:on_cpu]) + (shape.output_bytes if ngl == 0 else 0)
        compute = compute_bytes(shape, load, layers=on_cpu > 0, output=ngl == 0)
        return int(weights + on_cpu * kv_layer + load.contexts * compute)

    ngl = 0
    if device.on_gpu:
        while ngl <= n_layer and gpu_use(ngl + 1) <= gpu_budget:
            ngl += 1
    all_slots = n_layer + 1

    read = shape.active_layer_bytes                 # a mixture of experts reads only the experts a token uses

    def seconds_per_token(n: int) -> float:        # the token embeddings are a row lookup: not read whole
        on_cpu = n_layer - layers_on_gpu(n_layer, n)
        cpu_bytes = sum(read[:on_cpu]) + (shape.output_bytes if n == 0 else 0)
        gpu_bytes = sum(read) + shape.output_bytes - cpu_bytes
        return gpu_bytes / gpu_bandwidth + cpu_bytes / ram_bandwidth

    full_ctx = 0
    if device.on_gpu:
        fixed = gpu_use(all_slots) - n_layer * kv_layer          # weights and compute buffers of a full offload
        per_cell = n_layer * shape.kv_bytes_per_token_per_layer(load.kv_cache_type) * load.cells_per_ctx
        if gpu_budget > fixed:
            full_ctx = int((gpu_budget - fixed) / per_cell) // 256 * 256
    if not device.on_gpu:
        verdict = CPU
    elif ngl == all_slots:
        verdict = FITS
    else:
        verdict = PARTIAL
    ram = ram_use(ngl)
    if ram_budget and ram > ram_budget:
        verdict = TOO_BIG
    seconds = seconds_per_token(ngl)
    return Fit(verdict, ngl, n_layer, gpu_use(ngl), ram, gpu_budget, ram_budget,
               seconds_per_token(all_slots) / seconds if device.on_gpu else 0.0, 1.0 / seconds, full_ctx)


@dataclass(frozen=True)
class LayerChoice:
    """The `n_gpu_layers` a load uses and why, in words for the status bar."""

    n_gpu_layers: int
    reason: str
    fit: Fit | None = None        # the fit behind an `auto` choice


def choose_gpu_layers(settings: Settings, device: Memory, model_path: Path) -> LayerChoice:
    """The layers a load offloads: none without a GPU, the user's number when set (-2: all), else (`auto`, -1)
    the fit of the model at `model_path` with the load `settings` make, against the device's free memory now;
    with remote devices, all of them (rpc_placement splits them among the devices by free memory, as before)."""
    if not device.on_gpu:
        return LayerChoice(0, "")
    requested = settings.n_gpu_layers
    if requested == GPU_LAYERS_ALL:
        return LayerChoice(999, "GPU layers: all (set in Settings)")
    if requested != GPU_LAYERS_AUTO:
        return LayerChoice(requested, f"GPU layers: {requested} (set in Settings)")
    if settings.rpc_servers:                         # the layers go to remote devices too: split by their memory
        return LayerChoice(999, "auto: all layers, split among this GPU and the remote devices (rpc_placement)")
    try:
        shape = read_shape(model_path)
    except ModelLoadError as exc:                   # llama.cpp may still read it: offload as before, say why
        return LayerChoice(999, f"auto: all layers (the fit could not read the model's header: {exc})")
    result = fit(shape, device, LoadShape.of(settings, on_gpu=True))
    return LayerChoice(result.n_gpu_layers, auto_reason(result), result)


def auto_reason(result: Fit) -> str:
    """What `auto` chose and why, for the status bar."""
    free = (result.gpu_budget_bytes + GPU_MARGIN_BYTES) / GIB
    if result.verdict == FITS:
        return (f"auto: all {result.n_layer} layers on the GPU ({result.gpu_bytes / GIB:.1f} GiB of "
                f"{free:.1f} GiB free)")
    if result.n_gpu_layers == 0:
        return (f"auto: no layer fits in {free:.1f} GiB free VRAM (1 GiB kept free); running on the CPU")
    where = " (too big for the RAM as well)" if result.verdict == TOO_BIG else ""
    return (f"auto: {result.layers_on_gpu} of {result.n_layer} layers on the GPU, the rest on the CPU{where}: "
            f"{free:.1f} GiB free VRAM, 1 GiB kept free; ~{result.speed_vs_full:.0%} of full-offload speed"
            + (f"; all layers fit up to n_ctx {result.full_offload_ctx}" if result.full_offload_ctx else ""))
