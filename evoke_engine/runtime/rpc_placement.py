"""Which layers sit on which device when remote devices are set: this machine (its GPUs, or the CPU) and each
RPC worker's devices, as llama.cpp's `devices`, `n_gpu_layers` and `tensor_split`, and as rows to show.

Invariants: once any endpoint is registered in this process, every model load names its devices (`local_devices`
or a placement's list), because llama.cpp's default would take every registered worker, a lost one included;
layer shares follow the `rpc_layer_split` setting (this machine first), else the devices' free memory; the rows
count the repeating layers per device exactly as llama.cpp places them (`rpc_split.layer_counts`).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path

import llama_cpp as ll

from ..rpc_split import layer_counts, offloaded_layers, parse_endpoints, parse_layer_split
from . import device, rpc
from .llama_logs import quiet_llama_logs

_GPU_TYPES = {1, 2}                  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
_CPU_TYPE = 0


@dataclass(frozen=True)
class DeviceShare:
    """One device the model uses, for the status bar and `python -m evoke_engine device`."""

    name: str                    # "CPU", "CUDA0", "RPC0"
    description: str
    endpoint: str                # host:port of its worker; "" on this machine
    free_bytes: int
    total_bytes: int
    layers: int                  # repeating layers (weights and their KV cells) placed there

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Placement:
    """llama.cpp's model parameters for a split, and what they place where."""

    n_gpu_layers: int
    handles: list[int] | None                # ggml devices for llama.cpp; None: llama.cpp's own choice
    tensor_split: list[float] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)
    shares: tuple[DeviceShare, ...] = ()
    notices: list[str] = field(default_factory=list)
    _keep: list = field(default_factory=list, repr=False)

    def apply(self, mparams) -> None:
        """Write the placement into `llama_model_params` (the arrays live as long as this object)."""
        mparams.n_gpu_layers = self.n_gpu_layers
        if self.handles is None:
            return
        mparams.devices = _device_array(self.handles, self._keep)
        if self.tensor_split:
            split = (ctypes.c_float * ll.llama_max_devices())(*self.tensor_split)
            self._keep.append(split)
            mparams.tensor_split = split


def _device_array(handles: list[int], keep: list) -> int:
    array = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
    keep.append(array)
    return ctypes.cast(array, ctypes.c_void_p).value


def _devices_of_this_machine() -> list[tuple[int, str, str, int]]:
    """(handle, name, description, type) of the devices ggml lists that are not RPC workers."""
    device.load_backends()
    lib = device.ggml_library()
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(i)
        reg = lib.ggml_backend_dev_backend_reg(handle)
        if lib.ggml_backend_reg_name(reg).decode().startswith("RPC"):
            continue
        found.append((handle, lib.ggml_backend_dev_name(handle).decode(),
                      lib.ggml_backend_dev_description(handle).decode().strip(), lib.ggml_backend_dev_type(handle)))
    return found


def local_gpus() -> list[tuple[int, str, str]]:
    if device.detect().kind != "cuda":
        return []
    return [(h, n, d) for h, n, d, kind in _devices_of_this_machine() if kind in _GPU_TYPES]


_local_array_keep: list = []


@functools.lru_cache(maxsize=1)
def local_devices() -> int:
    """A `devices` array of this machine's GPUs only (none on the CPU): for every load once workers are known."""
    return _device_array([h for h, _, _ in local_gpus()], _local_array_keep)


def model_layers(path: Path) -> int:
    """The model's repeating layers (`<arch>.block_count`), read from a vocabulary-only load: no weights, no
    device (a vocabulary-only model reports n_layer 0, its metadata the truth)."""
    quiet_llama_logs()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    if rpc.any_registered():
        params.devices = local_devices()
    model = ll.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return 0
    try:
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
        arch = buf.value
        if ll.llama_model_meta_val_str(model, arch + b".block_count", buf, len(buf)) < 0:
            return 0
        return int(buf.value or 0)
    finally:
        ll.llama_model_free(model)


def plan(settings, dev: device.DeviceInfo, model_path: Path, default_gpu_layers: int) -> Placement:
    """The placement `settings` ask for: llama.cpp's default when no remote device is set (and none ever was),
    else this machine's share plus every reachable worker's (RemoteDeviceError names one that is not)."""
    endpoints = parse_endpoints(settings.rpc_servers)
    if not endpoints:
        if not rpc.any_registered():
            return Placement(default_gpu_layers, None)
        return Placement(default_gpu_layers, [h for h, _, _ in local_gpus()])
    remotes, notices = rpc.register(endpoints, skip_unreachable=settings.rpc_skip_unreachable)
    reachable = sorted({r.endpoint for r in remotes}, key=endpoints.index)
    shares = parse_layer_split(settings.rpc_layer_split, len(endpoints))
    remote_memory = [rpc.device_memory(r.handle) for r in remotes]
    gpus = local_gpus() if dev.on_gpu else []
    local_memory = [rpc.device_memory(h) for h, _, _ in gpus] or [_cpu_memory()]
    if shares is None:                                        # automatic: by free memory
        remote_weights = [float(free) for free, _ in remote_memory]
        local_weight = float(sum(free for free, _ in local_memory))
    else:
        per_endpoint = dict(zip(endpoints, shares[1:], strict=True))
        count = {e: sum(1 for r in remotes if r.endpoint == e) for e in reachable}
        remote_weights = [per_endpoint[r.endpoint] / count[r.endpoint] for r in remotes]
        local_weight = shares[0]
    n_layer = model_layers(model_path)
    if gpus:
        local_weights = [local_weight / len(gpus)] * len(gpus)
        handles = [r.handle for r in remotes] + [h for h, _, _ in gpus]
        split = remote_weights + local_weights
        n_gpu_layers = default_gpu_layers
        names = [(r.name, r.description, r.endpoint) for r in remotes] + [(n, d, "") for _, n, d in gpus]
        memory = remote_memory + local_memory
    else:
        handles = [r.handle for r in remotes]
        split = remote_weights
        n_gpu_layers = offloaded_layers(n_layer, local_weight, local_weight + sum(remote_weights)) if remotes else 0
        names = [(r.name, r.description, r.endpoint) for r in remotes]
        memory = remote_memory
    cpu_layers, device_layers = layer_counts(n_layer, n_gpu_layers, split)
    rows = [DeviceShare("CPU", dev.description if not gpus else "", "", *_cpu_memory(), cpu_layers)] \
        if cpu_layers or not gpus else []
    rows += [DeviceShare(name, desc, endpoint, free, total, layers)
             for (name, desc, endpoint), (free, total), layers in zip(names, memory, device_layers, strict=True)]
    return Placement(n_gpu_layers, handles, split, reachable, tuple(rows), notices)


def _cpu_memory() -> tuple[int, int]:
    for handle, _, _, kind in _devices_of_this_machine():
        if kind == _CPU_TYPE:
            return rpc.device_memory(handle)
    return 0, 0
