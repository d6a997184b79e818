"""A model's shape for the fit (runtime/fit.py): layer count, attention sizes and the bytes of each layer's
weights, read from a GGUF's header (metadata and tensor table, no weights) or stated for a file not yet downloaded.

Invariants: reading touches the header only (no llama.cpp, no weights, no dev-only `gguf` package: its GGUFReader
parses every tokenizer string and takes seconds); a shape's `layer_bytes` has one entry per repeating layer, and
its bytes are split into those, the output layer's and the input embeddings' without loss or overlap.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
# ggml type id -> (elements per block, bytes per block): ggml.c's type traits, as gguf-py's GGML_QUANT_SIZES
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}
# GGUF metadata value types: id -> struct format of a scalar (8: string, 9: array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.")
_EXPERT_TENSOR = re.compile(r"\.ffn_[a-z_]+_exps\.")     # routed experts (ffn_up_exps, ffn_gate_up_exps, ...)
_OUTPUT_TENSORS = ("output.weight", "output_norm.weight", "output_norm.bias", "output.bias")
_MAX_ARRAY_KEPT = 1024          # longer arrays (the tokenizer's) are skipped, not kept
_MAX_STRING = 64 << 20          # longer is a corrupt header (chat templates are some KB)


@dataclass(frozen=True)
class ModelShape:
    """What the fit weighs of a model: its attention sizes (for the KV cache and compute buffers) and where its
    weight bytes lie. `output_bytes`: weights on the output layer's device (the output matrix, or the tied
    embeddings' copy llama.cpp makes there, and the final norm); `input_bytes`: the token embeddings, which
    llama.cpp keeps in RAM at any `n_gpu_layers`."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    layer_bytes: tuple[int, ...]
    output_bytes: int
    input_bytes: int
    head_dim_k: int = 0              # 0: n_embd // n_head
    head_dim_v: int = 0
    n_ctx_train: int = 0
    n_expert: int = 0                # a mixture of experts: its experts per layer (0: dense)
    architecture: str = ""
    name: str = ""
    n_expert_used: int = 0           # experts a token runs through, per layer
    expert_bytes: tuple[int, ...] = ()   # per layer, the routed experts' tensors (ffn_*_exps), in layer_bytes

    def __post_init__(self) -> None:
        assert len(self.layer_bytes) == self.n_layer, "one weight size per repeating layer"
        assert min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv) > 0, "a shape has layers and heads"
        assert not self.expert_bytes or len(self.expert_bytes) == self.n_layer, "one expert size per layer"

    @property
    def active_layer_bytes(self) -> tuple[int, ...]:
        """The bytes of each layer one token reads: all but the routed experts, and of those the share it uses
        (`n_expert_used` of `n_expert`): a mixture of experts decodes at the speed of its active parameters. A
        dense model's are its `layer_bytes`."""
        if not self.expert_bytes or not self.n_expert or not self.n_expert_used:
            return self.layer_bytes
        share = min(1.0, self.n_expert_used / self.n_expert)
        return tuple(int(layer - experts + experts * share)
                     for layer, experts in zip(self.layer_bytes, self.expert_bytes, strict=True))

    @property
    def weight_bytes(self) -> int:
        """Every weight llama.cpp places somewhere (a tied output's copy counted twice, as loaded)."""
        return sum(self.layer_bytes) + self.output_bytes + self.input_bytes

    def kv_bytes_per_token_per_layer(self, kv_cache_type: str) -> float:
        """K and V of one token in one layer (Runtime.kv_bytes_per_token / n_layer for the loaded model)."""
        per_value = 2.0 if kv_cache_type == "f16" else 34 / 32          # q8_0: 34 bytes per 32 values
        head_k = self.head_dim_k or self.n_embd // self.n_head
        head_v = self.head_dim_v or self.n_embd // self.n_head
        return (head_k + head_v) * self.n_head_kv * per_value

    @classmethod
    def stated(cls, *, file_bytes: int, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int,
               n_vocab: int, tied_embeddings: bool = False, n_ctx_train: int = 0, name: str = "", head_dim: int = 0,
               n_expert: int = 0, n_expert_used: int = 0, n_ff_expert: int = 0) -> ModelShape:
        """A transformer's shape from its hyperparameters and the size of its GGUF (a catalogue entry before
        the download): the file's bytes split by parameter count among the layers, the embeddings and the output
        matrix; with `n_expert` routed experts of width `n_ff_expert` (and a router) in place of the feed-forward,
        the experts' share of each layer is `expert_bytes`. Quantisers keep the embeddings and the output a little
        wider (Q4_K_M: Q6_K output), so this under-weights the output layer by some tens of MB; the header of a file
        on disk (`read_shape`) is exact."""
        head_dim = head_dim or n_embd // n_head
        attention = 2 * n_embd * head_dim * n_head + 2 * n_embd * head_dim * n_head_kv
        experts = n_expert * 3 * n_embd * n_ff_expert if n_expert else 0
        feed_forward = experts + n_embd * n_expert if n_expert else 3 * n_embd * n_ff
        layer_params = attention + feed_forward
        embd_params = n_vocab * n_embd
        params = n_layer * layer_params + embd_params * (1 if tied_embeddings else 2)
        per_param = file_bytes / params
        layer = int(layer_params * per_param)
        embd = int(embd_params * per_param)
        output = embd                                               # tied: llama.cpp's copy on the output device
        input_bytes = file_bytes - n_layer * layer - (0 if tied_embeddings else output)
        return cls(n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, (layer,) * n_layer, output, input_bytes,
                   n_ctx_train=n_ctx_train, name=name, n_expert=n_expert, n_expert_used=n_expert_used,
                   expert_bytes=(int(experts * per_param),) * n_layer if n_expert else ())


def read_shape(path: Path) -> ModelShape:
    """The shape of the GGUF at `path`, from its header; ModelLoadError when it is no GGUF or lacks a layer count."""
    try:
        with Path(path).open("rb") as fh:
            meta, tensors = _read_header(fh)
    except OSError as exc:
        raise ModelLoadError(f"model file unreadable: {path} ({exc.strerror})") from exc
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"not a readable GGUF header ({exc}): {path}") from exc
    return shape_of(meta, tensors, str(path))


def shape_of(meta: dict[str, object], tensors: dict[str, int], where: str = "") -> ModelShape:
    """A shape from GGUF metadata and {tensor name: bytes}."""
    arch = str(meta.get("general.architecture", ""))

    def number(key: str, default: int = 0) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, list):                  # per-layer values (some hybrid models): the largest
            value = max((v for v in value if isinstance(v, int)), default=default)
        return int(value)  # type: ignore[arg-type]

    n_layer = number("block_count")
    if n_layer <= 0:
        raise ModelLoadError(f"GGUF has no {arch or '<architecture>'}.block_count: {where}")
    n_embd, n_head = number("embedding_length"), number("attention.head_count", 1) or 1
    layer_bytes = [0] * n_layer
    expert_bytes = [0] * n_layer
    output = input_bytes = 0
    for name, size in tensors.items():
        match = _LAYER_TENSOR.match(name)
        if match and int(match.group(1)) < n_layer:
            layer_bytes[int(match.group(1))] += size
            if _EXPERT_TENSOR.search(name):
                expert_bytes[int(match.group(1))] += size
        elif name in _OUTPUT_TENSORS:
            output += size
        else:                                        # token_embd and any other tensor outside the layers: RAM
            input_bytes += size
    if "output.weight" not in tensors:               # tied embeddings: llama.cpp copies them to the output device
        output += tensors.get("token_embd.weight", 0)
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = number("vocab_size") or (tokens if isinstance(tokens, int) else 0)
    return ModelShape(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=number("attention.head_count_kv", n_head) or n_head,
        n_ff=number("feed_forward_length"), n_vocab=n_vocab, layer_bytes=tuple(layer_bytes), output_bytes=output,
        input_bytes=input_bytes, head_dim_k=number("attention.key_length"),
        head_dim_v=number("attention.value_length"), n_ctx_train=number("context_length"),
        n_expert=number("expert_count"), architecture=arch, name=str(meta.get("general.name", "")),
        n_expert_used=number("expert_used_count"), expert_bytes=tuple(expert_bytes) if any(expert_bytes) else ())


def _read_header(fh: BinaryIO) -> tuple[dict[str, object], dict[str, int]]:
    """(metadata, {tensor name: bytes}) of a GGUF v2/v3 file; arrays longer than _MAX_ARRAY_KEPT are skipped and
    recorded as their length (so `tokenizer.ggml.tokens` gives the vocabulary size)."""
    if fh.read(4) != GGUF_MAGIC:
        raise ValueError("no GGUF magic")
    version, n_tensors, n_kv = struct.unpack("<IQQ", fh.read(20))
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    meta: dict[str, object] = {}
    for _ in range(n_kv):
        key = _string(fh)
        (kind,) = struct.unpack("<I", fh.read(4))
        meta[key] = _value(fh, kind)
    tensors: dict[str, int] = {}
    for _ in range(n_tensors):
        name = _string(fh)
        (n_dims,) = struct.unpack("<I", fh.read(4))
        if n_dims > 8:                                 # GGML_MAX_DIMS is 4
            raise ValueError(f"tensor {name} has {n_dims} dimensions")
        dims = struct.unpack(f"<{n_dims}Q", fh.read(8 * n_dims))
        kind, _offset = struct.unpack("<IQ", fh.read(12))
        if kind not in GGML_BLOCKS:
            raise ValueError(f"tensor {name} has an unknown ggml type {kind}")
        block, block_bytes = GGML_BLOCKS[kind]
        elements = 1
        for dim in dims:
            elements *= dim
        tensors[name] = elements // block * block_bytes
    return meta, tensors


def _string(fh: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", fh.read(8))
    if length > _MAX_STRING:                        # a corrupt length would have read() allocate it
        raise ValueError(f"a string of {length} bytes")
    return fh.read(length).decode("utf-8")


def _value(fh: BinaryIO, kind: int) -> object:
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        item_kind, length = struct.unpack("<IQ", fh.read(12))
        if length > _MAX_ARRAY_KEPT:
            _skip_array(fh, item_kind, length)
            return length
        return [_value(fh, item_kind) for _ in range(length)]
    fmt = _SCALARS.get(kind)
    if fmt is None:
        raise ValueError(f"unknown GGUF value type {kind}")
    return struct.unpack(fmt, fh.read(struct.calcsize(fmt)))[0]


def _skip_array(fh: BinaryIO, item_kind: int, length: int) -> None:
    if item_kind in _SCALARS:
        fh.seek(struct.calcsize(_SCALARS[item_kind]) * length, 1)
        return
    for _ in range(length):
        if item_kind == _STRING:
            (n,) = struct.unpack("<Q", fh.read(8))
            fh.seek(n, 1)
        else:
            _value(fh, item_kind)
