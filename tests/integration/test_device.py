"""Device choice: what the status bar says, and a CUDA build that finds no GPU runs on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from app.widgets.status_bar import device_details, device_summary
from evoke_engine.runtime import device


def _info(**kw):
    base = dict(device="CPU (Xeon)", device_kind="cpu", device_notice="", n_gpu_layers=0, n_layer=30,
                vram_weights_bytes=0, vram_kv_bytes=0, vram_total_bytes=0, vram_free_bytes=0)
    return SimpleNamespace(**{**base, **kw})


def test_status_bar_names_the_gpu_its_layers_and_vram():
    info = _info(device="CUDA0 (NVIDIA GeForce RTX 4090)", device_kind="cuda", n_gpu_layers=28, n_layer=28,
                 vram_weights_bytes=4 << 30, vram_kv_bytes=1 << 29, vram_total_bytes=24 << 30,
                 vram_free_bytes=18 << 30)
    assert device_summary(info) == "CUDA0 · 28 layers · VRAM 4.5 GiB"
    details = device_details(info)
    assert "RTX 4090" in details and "GPU layers: 28 of 28" in details
    assert "weights 4.0 GiB, KV cache 0.5 GiB; 18.0 GiB free of 24.0 GiB" in details


def test_status_bar_says_how_many_layers_auto_put_on_the_gpu_and_why():
    reason = "auto: 20 of 64 layers on the GPU, the rest and the KV cache in RAM (18.0 GiB free)"
    info = _info(device="CUDA0 (NVIDIA GeForce RTX 4070)", device_kind="cuda", n_gpu_layers=20, n_layer=64,
                 vram_weights_bytes=9 << 30, vram_kv_bytes=1 << 30, vram_total_bytes=12 << 30,
                 vram_free_bytes=1 << 30, gpu_layers_reason=reason)
    assert device_summary(info) == "CUDA0 · 20 of 64 layers (auto) · VRAM 10.0 GiB"
    assert f"GPU layers chosen: {reason}" in device_details(info)


def test_status_bar_says_when_the_gpu_is_not_used():
    assert device_summary(_info()) == "CPU"
    fallback = _info(device_notice="CUDA build, but no GPU or NVIDIA driver found; running on the CPU")
    assert device_summary(fallback) == "CPU (GPU not used)"
    assert "no GPU or NVIDIA driver" in device_details(fallback)


def test_detect_matches_the_installed_build():
    info = device.detect()
    assert info.build == ("cuda" if device.cuda_build() else "cpu")
    if info.build == "cpu":
        assert info.kind == "cpu" and info.notice == ""


FALLBACK_CHILD = """
import json
from evoke_engine.runtime.runtime import Runtime
from evoke_engine.settings import Settings
rt = Runtime(Settings(n_ctx=512, slots=1, home={home!r}))
rt.decode(rt.tokenize("The capital of France is"), 0, 0)
info = rt.info()
print(json.dumps({{"kind": info.device_kind, "notice": info.device_notice, "layers": info.n_gpu_layers,
                   "finite": bool(abs(rt.logits()).max() < 1e4)}}))
"""


@pytest.mark.cuda_build
@pytest.mark.parametrize("hide", ["CUDA_VISIBLE_DEVICES", "EVOKE_GPU"])
def test_cuda_build_runs_on_the_cpu_when_no_gpu_is_visible(tmp_path, hide):
    """With the GPU hidden (or on a machine without one) the CUDA build loads, decodes on the
    CPU and says why, instead of failing at import."""
    env = {**os.environ, hide: "" if hide == "CUDA_VISIBLE_DEVICES" else "cpu"}
    child = subprocess.run([sys.executable, "-c", FALLBACK_CHILD.format(home=str(tmp_path))],
                           env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert (report["kind"], report["layers"], report["finite"]) == ("cpu", 0, True)
    assert "CPU" in report["notice"] or "not used" in report["notice"]


def test_automatic_threads_leave_busy_cores_alone():
    cpus = set(range(os.cpu_count() or 1))
    cores = device.physical_cores(cpus)
    assert 1 <= cores <= len(cpus)
    assert device.auto_threads(cpus, load=0.0) == cores
    assert device.auto_threads(cpus, load=float(len(cpus))) == 1          # every core busy: one thread
    assert device.auto_threads(cpus, load=len(cpus) + 5.0) == 1


# -- remote devices (RPC): settings, the layer arithmetic, the worker command, the status bar -------------------
def test_remote_device_settings_are_checked_with_a_clear_message():
    from evoke_engine.rpc_split import parse_endpoints, parse_layer_split
    from evoke_engine.settings import Settings

    assert parse_endpoints(" 10.0.0.2:50052,\nbox:7000 ") == ["10.0.0.2:50052", "box:7000"]
    for bad, says in [("10.0.0.2", "host:port"), ("box:0", "host:port"), ("box:99999", "host:port"),
                      (":5", "host:port"), ("a:1,a:1", "twice"), ("[::1]:5", "IPv4")]:
        with pytest.raises(ValueError, match=says):
            parse_endpoints(bad)
    assert parse_layer_split("", 2) is None                                 # automatic: by free memory
    assert parse_layer_split("1, 1 ,2", 2) == [1.0, 1.0, 2.0]
    for bad, says in [("1,1", "needs 3"), ("1,x,1", "numbers"), ("0,0,0", "not all zero"), ("1,-1,1", "zero or more")]:
        with pytest.raises(ValueError, match=says):
            parse_layer_split(bad, 2)
    with pytest.raises(ValueError, match="needs 2"):
        Settings(rpc_servers="a:1", rpc_layer_split="1,1,1")
    assert Settings(rpc_servers="a:1", rpc_layer_split="3,1").rpc_layer_split == "3,1"


def test_layer_counts_follow_llama_cpps_placement():
    from evoke_engine.rpc_split import layer_counts, offloaded_layers

    # SmolLM2-135M: 30 repeating layers + the output layer; this machine and two workers, even shares.
    offloaded = offloaded_layers(30, 1.0, 3.0)
    assert offloaded == 21                                                   # llama.cpp logs "offloaded 21/31 layers"
    assert layer_counts(30, offloaded, [1.0, 1.0]) == (10, [11, 9])         # the output layer is the last device's
    assert layer_counts(30, 0, [1.0, 1.0]) == (30, [0, 0])
    assert layer_counts(30, 999, [1.0, 3.0]) == (0, [8, 22])                # a local GPU after one worker
    assert offloaded_layers(30, 0.0, 2.0) == 31 and offloaded_layers(30, 2.0, 2.0) == 0
    cpu, per_device = layer_counts(47, offloaded_layers(47, 2.0, 7.0), [2.0, 3.0])
    assert cpu + sum(per_device) == 47


def test_rpc_worker_refuses_another_address_without_the_flag_and_warns_with_it(capsys):
    from argparse import Namespace

    from evoke_engine.runtime import rpc_worker

    args = Namespace(host="0.0.0.0", port=50052, allow_remote=False, threads=0, cache=False)
    assert rpc_worker.main(args) == 2
    assert "no authentication or encryption" in capsys.readouterr().err
    assert rpc_worker.is_loopback("127.0.0.1") and rpc_worker.is_loopback("localhost")
    assert not rpc_worker.is_loopback("192.168.1.20")
    with pytest.raises(rpc_worker.WorkerError, match="allow-remote"):
        rpc_worker.start("192.168.1.20", 50052)


def test_status_bar_lists_each_device_with_its_layers_and_memory():
    from evoke_engine.runtime.rpc_placement import DeviceShare

    shares = (DeviceShare("CPU", "Xeon", "", 8 << 30, 16 << 30, 10),
              DeviceShare("RPC0", "10.0.0.2:50052", "10.0.0.2:50052", 20 << 30, 24 << 30, 20))
    info = _info(devices=shares)
    assert device_summary(info) == "Layers: CPU 10 · RPC0 20"
    details = device_details(info)
    assert "CPU (this machine): 10 layers; 8.0 GiB free of 16.0 GiB" in details
    assert "RPC0 (remote 10.0.0.2:50052): 20 layers; 20.0 GiB free of 24.0 GiB" in details
