#!/usr/bin/env bash
# Rebuilds llama-cpp-python with CUDA into .venv (needs nvcc and a CUDA driver), then the native helper.
# Same pinned version as pyproject.toml; --no-cache-dir so the CPU wheel in pip's cache is not reused.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml | cut -d= -f3)
CMAKE_ARGS="-DGGML_CUDA=on ${CMAKE_ARGS:-}" FORCE_CMAKE=1 \
  .venv/bin/python -m pip install --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==$VERSION"
bash native/build.sh
.venv/bin/python -c "import llama_cpp as ll; print('GPU offload:', bool(ll.llama_supports_gpu_offload()))"
