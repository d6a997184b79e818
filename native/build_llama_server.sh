#!/usr/bin/env bash
# Builds llama-server from the llama.cpp sources that the pinned llama-cpp-python vendors (CPU, CMake,
# --target llama-server) into build/llama-server/, for `bench switch|reopen|prewarm --server PATH`.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml | cut -d= -f3)
OUT=build/llama-server
SRC=$OUT/src/llama_cpp_python-$VERSION/vendor/llama.cpp
if [ ! -d "$SRC" ]; then
  mkdir -p "$OUT/src"
  .venv/bin/python -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$OUT/src"
  tar xzf "$OUT/src/llama_cpp_python-$VERSION.tar.gz" -C "$OUT/src"
fi
cmake -S "$SRC" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$OUT/cmake" --target llama-server -j "$(nproc)"
ln -sf "cmake/bin/llama-server" "$OUT/llama-server"
echo "built $OUT/llama-server (llama.cpp vendored by llama-cpp-python $VERSION)"
