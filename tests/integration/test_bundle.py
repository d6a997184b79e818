"""Issue 62: the one-folder bundle (dist/evoke-desk/, `make bundle`) runs on a machine it is copied to. From a scrubbed
environment (only PATH=/usr/bin:/bin, a fresh HOME, a folder outside the checkout: no venv, no cache) the bundled
`evoke-desk` answers --version, chats a turn on the embedded model headless with the exported ONNX embedder and the
direct KV path, its device report names the direct KV path and the native 8/4-bit kernels, and its `bench restore`
moves a block by the direct path, on the best variant this CPU runs and on the baseline one
(EVOKE_NATIVE_VARIANT=baseline: any x86-64). Its llama.cpp core and the
baseline libraries use no AVX register (objdump), and it carries no torch.

Slow. Where PyInstaller is importable (CI installs it) the test builds the bundle first (packaging/build_bundle.sh,
each step cached: minutes once the portable llama.cpp wheel is built); elsewhere it checks the bundle in dist/ (or
$EVOKE_BUNDLE) when there is one, and skips when there is none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import threading
import time
import tomllib
from pathlib import Path

import pytest

from evoke_engine import package_files

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "packaging" / "build_bundle.sh"
BUNDLE_DIR = Path(os.environ.get("EVOKE_BUNDLE") or ROOT / "dist" / "evoke-desk").resolve()   # run from elsewhere
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
NO_DIRECT = "KV blocks move through llama.cpp's serialised state"      # kv.py logs it when the direct path is off


@pytest.fixture(scope="module")
def bundle() -> Path:
    """The bundled executable: built now where PyInstaller is installed, else the one in dist/ (or skip)."""
    if not os.environ.get("EVOKE_BUNDLE") and importlib.util.find_spec("PyInstaller") and BUILD_SCRIPT.is_file():
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=3600)
        assert done.returncode == 0, done.stderr[-6000:]
    exe = BUNDLE_DIR / "evoke-desk"
    if not exe.is_file():
        pytest.skip(f"no bundle at {BUNDLE_DIR}: `make bundle` builds it (so does this test, with PyInstaller)")
    return exe


def scrubbed(tmp_path: Path, **extra: str) -> dict[str, str]:
    """What `env -i` leaves plus a fresh home: no venv on PATH, no Python variables, empty caches."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "QT_QPA_PLATFORM": "offscreen", **extra}


def run(exe: Path, args: list[str], env: dict[str, str], tmp_path: Path, timeout: int = 300, **kwargs):
    outside = tmp_path / "elsewhere"
    outside.mkdir(exist_ok=True)
    return subprocess.run([str(exe), *args], env=env, cwd=outside, capture_output=True, text=True, timeout=timeout,
                          **kwargs)


def device_report(exe: Path, env: dict[str, str], tmp_path: Path) -> dict:
    done = run(exe, ["device"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_version_from_a_scrubbed_environment(bundle, tmp_path):
    done = run(bundle, ["--version"], scrubbed(tmp_path), tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"evoke-desk {VERSION}"          # the installed metadata, not "(source tree)"


@pytest.mark.parametrize("variant", ["", "baseline"])
def test_the_device_report_names_the_direct_kv_path_and_the_native_kernels(bundle, tmp_path, variant):
    env = scrubbed(tmp_path, **({package_files.VARIANT_ENV: variant} if variant else {}))
    report = device_report(bundle, env, tmp_path)
    assert report["kv_direct_loaded"] is True and report["kv_quant_native"] is True, report
    libraries = report["native_libraries"]
    assert set(libraries) == set(package_files.NATIVE_LIBRARIES) and all(libraries.values()), libraries
    expected = package_files.BASELINE if variant else package_files.runnable_variants()[1]   # the best portable one
    for found in libraries.values():
        assert found["variant"] == expected, libraries              # never the -march=native build: not shipped
        assert Path(found["path"]).is_relative_to(BUNDLE_DIR.resolve()), found
    assert report["build"] == "cpu"


def _chat_turn(bundle: Path, env: dict[str, str], tmp_path: Path) -> tuple[str, str]:
    """One headless turn (`evoke-desk chat`), kept open until the embedder has warmed; (stdout, log file)."""
    log_file = Path(env["HOME"]) / ".local" / "state" / "evoke-desk" / "log" / "evoke-desk.log"
    outside = tmp_path / "elsewhere"
    outside.mkdir(exist_ok=True)
    chat = subprocess.Popen([str(bundle), "chat"], env=env, cwd=outside, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(chat.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        chat.stdin.write("Name one planet.\n")
        chat.stdin.flush()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and chat.poll() is None:
            log = log_file.read_text(errors="replace") if log_file.exists() else ""
            if "tokens," in "".join(out) and re.search(r"embedder \S+ runs on", log):
                break
            time.sleep(0.5)
        chat.stdin.write("/quit\n")
        chat.stdin.close()
        err = chat.stderr.read()
        assert chat.wait(timeout=120) == 0, err
    finally:
        if chat.poll() is None:
            chat.kill()
    reader.join(timeout=10)
    return "".join(out), log_file.read_text(errors="replace")


@pytest.mark.parametrize("variant", ["", "baseline"])
def test_a_headless_turn_on_the_embedded_model_with_the_onnx_embedder_and_the_direct_path(bundle, tmp_path, variant):
    env = scrubbed(tmp_path, **({package_files.VARIANT_ENV: variant} if variant else {}))
    stdout, log = _chat_turn(bundle, env, tmp_path)
    assert "evoke> " in stdout and "tokens," in stdout, stdout
    assert "runs on OnnxSentenceEncoder" in log, log[-3000:]           # the export the bundle carries, no torch
    assert NO_DIRECT not in log, log[-3000:]                          # calibrated on the model: the direct path
    cache = Path(env["HOME"]) / ".cache" / "evoke-desk" / "embedders"
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".json", ".onnx"]


def test_no_torch_and_a_portable_llama_cpp(bundle):
    internal = BUNDLE_DIR / "_internal"
    for gone in ("torch", "sentence_transformers", "transformers"):
        assert not (internal / gone).exists(), gone
    lib = internal / "llama_cpp" / "lib"
    assert len(list(lib.glob("libggml-cpu-*.so"))) > 3             # llama.cpp picks its CPU backend at load
    assert not (lib / "libggml-cpu.so").exists()                   # no backend built for the build machine
    if shutil.which("objdump") is None:
        pytest.skip("no objdump: the instruction check needs it")
    # No AVX (ymm) or AVX-512 (zmm) register in llama.cpp's core, its x86-64 CPU backend or the baseline native
    # libraries: they run on any x86-64; the faster variants are picked at load only where the CPU has them.
    core = [lib / name for name in ("libllama.so", "libggml-base.so", "libggml.so", "libggml-cpu-x64.so")]
    variant_dir = internal / "native" / "build" / package_files.BASELINE
    for path in [*core, *(variant_dir / name for name in package_files.NATIVE_LIBRARIES)]:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                              check=True).stdout
        assert not re.search(r"%[yz]mm", text), f"{path.name} uses AVX registers"


@pytest.mark.parametrize("variant", ["", "baseline"])
def test_the_bundles_restore_bench_takes_the_direct_path(bundle, tmp_path, variant):
    """`evoke-desk bench restore` (the lab's code, as `python -m benchmarks restore` runs it;
    packaging/bundle_restore.py times the two side by side) moves a block by the direct path with the native
    re-anchor, on this CPU's best variant and on the baseline one. A check, not a figure."""
    env = scrubbed(tmp_path, **({package_files.VARIANT_ENV: variant} if variant else {}))
    done = run(bundle, ["bench", "restore", "--json", "--sizes", "32", "--trials", "1"], env, tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["direct_path"] is True and result["native_reanchor"] is True, result
    assert [row["path"] for row in result["rows"]] == ["direct"], result["rows"]
