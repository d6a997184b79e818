"""Fit marks for the model lists (the window's model dialog): each catalogue quant judged against this machine before
its download, from a shape stated by the entry's layer count, parameters and file size, and each file on disk from
its own GGUF header (runtime/fit.py does the arithmetic).

Invariants: no Qt and no network; a mark never raises for an odd entry or an unreadable file, it says the fit is
unknown instead; a stated shape's bytes add up to the quant's listed size (ModelShape.stated splits them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ModelLoadError
from ..runtime.fit import Fit, LoadShape, Memory, fit
from ..runtime.gguf_shape import ModelShape, read_shape
from .catalogue import Catalogue, CatalogueModel, LocalModel, Quant, local_models


@dataclass(frozen=True)
class Hyper:
    """What the catalogue does not state and a stated shape needs (from the models' config.json, public)."""

    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    tied: bool = False
    head_dim_k: int = 0       # 0: n_embd // n_head (as in the GGUF's attention.key_length / value_length)
    head_dim_v: int = 0
    n_expert: int = 0         # a mixture of experts: routed experts per layer, used per token, each one's width
    n_expert_used: int = 0
    n_ff_expert: int = 0


# The shipped catalogue's entries (config.json of each repository's source model). Qwen3-Coder's experts are stated
# (fit.py places every expert and reads the used ones); DeepSeek-V2-Lite is still weighed as dense (n_ff its first,
# dense layer's width; shared experts and a dense layer are not stated here); its KV is llama.cpp's MLA cache.
KNOWN_HYPER: dict[str, Hyper] = {
    "qwen2.5-coder-0.5b-fim": Hyper(896, 14, 2, 4864, 151936, tied=True),
    "qwen2.5-coder-1.5b-fim": Hyper(1536, 12, 2, 8960, 151936, tied=True),
    "qwen2.5-coder-1.5b-instruct": Hyper(1536, 12, 2, 8960, 151936, tied=True),
    "qwen2.5-coder-7b-instruct": Hyper(3584, 28, 4, 18944, 152064),
    "qwen2.5-coder-14b-instruct": Hyper(5120, 40, 8, 13824, 152064),
    "qwen2.5-coder-32b-instruct": Hyper(5120, 40, 8, 27648, 152064),
    "qwen3-coder-30b-a3b-instruct": Hyper(2048, 32, 4, 6144, 151936, head_dim_k=128, head_dim_v=128, n_expert=128,
                                          n_expert_used=8, n_ff_expert=768),
    "deepseek-coder-v2-lite-instruct": Hyper(2048, 16, 1, 10944, 102400, head_dim_k=576, head_dim_v=512),
    "codestral-22b": Hyper(6144, 48, 8, 16384, 32768),
}
HEAD_DIM = 128                 # an estimate's head width, and its KV heads: modern GQA models' common values
ESTIMATE_KV_HEADS = 8
ESTIMATE_VOCAB = 152064


def estimated_hyper(params_b: float, n_layer: int) -> Hyper:
    """A dense transformer's sizes from its parameter count and layer count, for an entry KNOWN_HYPER lacks: the
    width whose parameters (attention with 8 KV heads, a feed-forward of 4x the width, untied embeddings) come
    closest, a multiple of the head width. Errs towards a larger KV cache, so a mark errs towards "does not fit"."""
    target = params_b * 1e9

    def params(n_embd: int) -> float:
        kv = min(ESTIMATE_KV_HEADS, n_embd // HEAD_DIM)
        layer = 2 * n_embd * n_embd + 2 * n_embd * HEAD_DIM * kv + 3 * n_embd * 4 * n_embd
        return n_layer * layer + 2 * ESTIMATE_VOCAB * n_embd

    widths = range(HEAD_DIM * 4, HEAD_DIM * 129, HEAD_DIM)
    n_embd = min(widths, key=lambda width: abs(params(width) - target))
    n_head = n_embd // HEAD_DIM
    return Hyper(n_embd, n_head, min(ESTIMATE_KV_HEADS, n_head), 4 * n_embd, ESTIMATE_VOCAB)


def stated_shape(model: CatalogueModel, quant: Quant) -> ModelShape | None:
    """The shape of one quant of a catalogue entry before its download (None without a layer count)."""
    if not model.n_layer:
        return None
    hyper = KNOWN_HYPER.get(model.id) or estimated_hyper(model.params_b, model.n_layer)
    shape = ModelShape.stated(file_bytes=quant.size_bytes, n_layer=model.n_layer, n_embd=hyper.n_embd,
                              n_head=hyper.n_head, n_head_kv=hyper.n_head_kv, n_ff=hyper.n_ff, n_vocab=hyper.n_vocab,
                              tied_embeddings=hyper.tied, n_ctx_train=model.context_length, name=model.name,
                              head_dim=hyper.head_dim_k if hyper.n_expert else 0, n_expert=hyper.n_expert,
                              n_expert_used=hyper.n_expert_used, n_ff_expert=hyper.n_ff_expert)
    return replace(shape, head_dim_k=hyper.head_dim_k, head_dim_v=hyper.head_dim_v)


@dataclass(frozen=True)
class QuantMark:
    """One quant of a catalogue entry as the dialog lists it: its size, its fit here, and its file if on disk."""

    model: CatalogueModel
    quant: Quant
    fit: Fit | None
    on_disk: Path | None

    @property
    def fit_label(self) -> str:
        return self.fit.label() if self.fit is not None else "fit unknown (the catalogue gives no layer count)"

    @property
    def spec(self) -> str:
        """What `pull` takes for this file: REPO:FILE."""
        return f"{self.model.repo}:{self.quant.file}"


@dataclass(frozen=True)
class LocalMark:
    """A model file on disk with its fit here (from its header)."""

    local: LocalModel
    fit: Fit | None
    fit_label: str


def catalogue_marks(catalogue: Catalogue, folder: Path, device: Memory, load: LoadShape) -> list[QuantMark]:
    """Every quant of every entry, in catalogue order, with its fit and where it is on disk (None: not yet)."""
    have = {(m.catalogue_id, (m.quant or "").lower()): m.path for m in local_models(folder, catalogue)}
    marks = []
    for model in catalogue.models:
        for quant in model.quants:
            shape = stated_shape(model, quant)
            marks.append(QuantMark(model, quant, fit(shape, device, load) if shape else None,
                                   have.get((model.id, quant.name.lower()))))
    return marks


def file_fit(path: Path, device: Memory, load: LoadShape) -> tuple[Fit | None, str]:
    """A file's fit from its GGUF header, and its label ("fit unknown: ..." for a file the header reader refuses)."""
    try:
        result = fit(read_shape(path), device, load)
    except ModelLoadError as exc:
        return None, f"fit unknown: {exc}"
    return result, result.label()


def judge_file(path: Path, settings) -> str:
    """The fit label of the file at `path` on the device detected now, under the load `settings` make."""
    from ..runtime import device as devices

    found = devices.detect()
    return file_fit(path, found, LoadShape.of(settings, found.on_gpu))[1]


def local_marks(folder: Path, catalogue: Catalogue | None, device: Memory, load: LoadShape) -> list[LocalMark]:
    """The models folder's GGUF files (partials never), each with its fit."""
    return [LocalMark(local, *file_fit(local.path, device, load)) for local in local_models(folder, catalogue)]


@dataclass(frozen=True)
class MachineMarks:
    """What the model dialog lists, judged for this machine and the load the settings make."""

    device_label: str            # "CUDA0 (NVIDIA ...): 11.6 GiB of 12.0 GiB free; RAM 28.0 GiB free"
    load: LoadShape
    catalogue: list[QuantMark]
    on_disk: list[LocalMark]
    folder: Path


def machine_marks(settings, catalogue: Catalogue, device: Memory | None = None) -> MachineMarks:
    """The catalogue's quants and the models folder's files with their fit on `device` (detected now when None)
    under the load `settings` make. Reads GGUF headers and asks llama.cpp for the device: not for a GUI thread."""
    from ..runtime import device as devices
    from .catalogue import models_dir

    device = device or devices.detect()
    load = LoadShape.of(settings, device.on_gpu)
    folder = models_dir(settings.data_dir)
    gib = 1 << 30
    ram = (device.ram_available_bytes or device.ram_total_bytes) / gib
    where = getattr(device, "label", lambda: "this machine")()
    if device.on_gpu:
        total = getattr(device, "vram_total_bytes", 0)
        where += f": {device.vram_free_bytes / gib:.1f} GiB of {total / gib:.1f} GiB free"
    label = f"{where}; RAM {ram:.1f} GiB free; judged at a context of {load.n_ctx} tokens ({load.kv_cache_type} KV)"
    return MachineMarks(label, load, catalogue_marks(catalogue, folder, device, load),
                        local_marks(folder, catalogue, device, load), folder)
