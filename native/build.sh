#!/usr/bin/env bash
# Builds native/build/libevoke_rope.so (the K re-anchoring routine) with the system C compiler.
# Tuned for the CPU it is built on; the engine falls back to llama.cpp's own K-shift without it.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p build
CC=${CC:-cc}
FLAGS="-O3 -fPIC -shared -ffp-contract=off"
if ! $CC $FLAGS -march=native rope_reanchor.c -o build/libevoke_rope.so -lm 2>/dev/null; then
  $CC $FLAGS -mf16c rope_reanchor.c -o build/libevoke_rope.so -lm
fi
echo "built native/build/libevoke_rope.so"
