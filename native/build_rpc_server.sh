#!/usr/bin/env bash
# Builds rpc-server (llama.cpp's RPC worker, tools/rpc/rpc-server.cpp of the sdist the pinned llama-cpp-python
# vendors) with CMake against the installed llama-cpp-python's libggml, into native/build/ (or DIR:
# `bash native/build_rpc_server.sh DIR`, e.g. the installed package's native folder). Linking the app's own ggml
# keeps the RPC protocol identical on both ends and gives the worker the install's backends (the CPU, or CUDA
# after `make gpu`). Needs a llama-cpp-python built with GGML_RPC=ON (native/build_cpu.sh, build_cuda.sh).
# Time on the 2-core development machine: 6 s from a clean CMake folder (one C++ file), plus ~10 s the first time
# to download the sdist into build/llama-src/ (shared with the wheel build).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-native/build}")
PY=${PYTHON:-.venv/bin/python}
LLAMA_PY=$PY
source native/llama_wheel.sh
SRC=$(llama_sdist)/vendor/llama.cpp/tools/rpc/rpc-server.cpp
PKG=$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("llama_cpp").origin))')
LIB="$PKG/lib"
INC=$(realpath -m "$PKG/../include")
[ -f "$INC/ggml-rpc.h" ] || { echo "no ggml headers under $INC: reinstall llama-cpp-python (native/build_cpu.sh)" >&2; exit 1; }
if ! ls "$LIB"/libggml-rpc.so* >/dev/null 2>&1; then
  echo "the installed llama-cpp-python has no RPC backend: run bash native/build_cpu.sh (or build_cuda.sh)" >&2
  exit 1
fi
start=$(date +%s)
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then "$PY" -m pip install -q "cmake>=3.21" && CMAKE=$(dirname "$PY")/cmake; fi
CMAKE_DIR=build/rpc-server/cmake
"$CMAKE" -S native/rpc_server -B "$CMAKE_DIR" -DCMAKE_BUILD_TYPE=Release -DRPC_SERVER_SOURCE="$PWD/$SRC" \
  -DLLAMA_LIB_DIR="$LIB" -DGGML_INCLUDE_DIR="$INC" >/dev/null
"$CMAKE" --build "$CMAKE_DIR" -j "$(nproc)" >/dev/null
mkdir -p "$OUT"
cp "$CMAKE_DIR/rpc-server" "$OUT/rpc-server.tmp" && mv "$OUT/rpc-server.tmp" "$OUT/rpc-server"
echo "built $OUT/rpc-server in $(( $(date +%s) - start )) s (llama.cpp vendored by llama-cpp-python $LLAMA_VERSION)"
