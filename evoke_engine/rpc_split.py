"""The remote-device settings as values: `host:port` endpoints, the per-device layer share, and which layers
llama.cpp puts on which device for a given `n_gpu_layers` and tensor split (its own arithmetic, no llama.cpp call).

Invariants: an endpoint is `host:port` with a port in 1..65535; a layer split names one non-negative share for this
machine and one per endpoint, in that order, not all zero; `layer_counts` reproduces llama.cpp's `load_tensors`
placement (llama-model.cpp: split points by cumulative share, `upper_bound` over `(il - i_gpu_start) / n_offloaded`).
"""

from __future__ import annotations

import re

import numpy as np

DEFAULT_WORKER_PORT = 50052            # rpc-server's own default
_SEPARATORS = re.compile(r"[,\s]+")


def parse_endpoints(text: str) -> list[str]:
    """`host:port` entries separated by commas, spaces or new lines; ValueError names the first bad one."""
    endpoints: list[str] = []
    for item in _SEPARATORS.split(text or ""):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"remote device {item!r}: write it as host:port (e.g. 192.168.1.20:{DEFAULT_WORKER_PORT})")
        if any(ch in host for ch in "/[]@"):
            raise ValueError(f"remote device {item!r}: the host must be a name or an IPv4 address")
        if item in endpoints:
            raise ValueError(f"remote device {item!r} is listed twice")
        endpoints.append(item)
    return endpoints


def parse_layer_split(text: str, n_endpoints: int) -> list[float] | None:
    """Shares for [this machine, endpoint 1, ...]; None when empty (automatic: by free memory)."""
    items = [s for s in _SEPARATORS.split(text or "") if s]
    if not items:
        return None
    try:
        shares = [float(s) for s in items]
    except ValueError:
        raise ValueError(f"layer split {text!r}: give numbers, e.g. 1,1,2 (this machine first, then each "
                         "remote device)") from None
    if len(shares) != n_endpoints + 1:
        raise ValueError(f"layer split {text!r} has {len(shares)} shares; it needs {n_endpoints + 1}: this machine "
                         f"first, then each of the {n_endpoints} remote device(s), or leave it empty (automatic)")
    if any(s < 0 or s != s for s in shares) or sum(shares) <= 0:
        raise ValueError(f"layer split {text!r}: shares must be zero or more, and not all zero")
    return shares


def check_settings(endpoints_text: str, split_text: str) -> None:
    """ValueError when the remote-device settings cannot be used (Settings.validate)."""
    parse_layer_split(split_text, len(parse_endpoints(endpoints_text)))


def offloaded_layers(n_layer: int, local_share: float, total_share: float) -> int:
    """`n_gpu_layers` that leaves this machine's CPU `local_share / total_share` of the n_layer + 1 layer slots
    (the repeating layers and the output layer); the input layer always stays on the CPU."""
    slots = n_layer + 1
    if total_share <= 0:
        return 0
    return max(0, min(slots, round(slots * (1.0 - local_share / total_share))))


def layer_counts(n_layer: int, n_gpu_layers: int, shares: list[float]) -> tuple[int, list[int]]:
    """(repeating layers on the CPU, repeating layers per device) as llama.cpp assigns them: the last
    `n_gpu_layers` of the n_layer + 1 slots are offloaded, split among the devices by cumulative share
    (in float32, as llama.cpp computes it, so a layer on a boundary lands where llama.cpp puts it)."""
    if not shares or sum(shares) <= 0:
        return n_layer, [0] * len(shares)
    cumulative = np.cumsum(np.asarray(shares, dtype=np.float32), dtype=np.float32)
    splits = (cumulative / cumulative[-1]).astype(np.float32)
    slots = n_layer + 1
    i_gpu_start = max(slots - n_gpu_layers, 0)
    active = min(n_gpu_layers, slots)
    cpu, per_device = 0, [0] * len(shares)
    for il in range(n_layer):
        if il < i_gpu_start or il - i_gpu_start >= active:
            cpu += 1
            continue
        ratio = np.float32(il - i_gpu_start) / np.float32(active)
        index = int(np.searchsorted(splits, ratio, side="right"))
        per_device[min(index, len(shares) - 1)] += 1
    return cpu, per_device
