#!/usr/bin/env bash
# Builds native/build/libevoke_rope.so (the K re-anchoring routine) with the system C compiler.
# Tuned for the CPU it is built on; the engine falls back to llama.cpp's own K-shift without it.
# `bash native/build.sh DIR` builds into DIR instead: for an installed package, the folder that
# `python -P -c 'import evoke_engine.package_files as p; print(p.native_dir())'` prints (PYTHON= that python).
set -euo pipefail
OUT=$(realpath -m "${1:-$(dirname "$0")/build}")
cd "$(dirname "$0")"
mkdir -p "$OUT"
CC=${CC:-cc}
FLAGS="-O3 -fPIC -shared -ffp-contract=off"
if ! $CC $FLAGS -march=native rope_reanchor.c -o "$OUT/libevoke_rope.so" -lm 2>/dev/null; then
  $CC $FLAGS -mf16c rope_reanchor.c -o "$OUT/libevoke_rope.so" -lm
fi
echo "built $OUT/libevoke_rope.so"

# The attention capture (issue 9): a cb_eval callback built against the installed llama-cpp-python.
# Optional: when it does not build, the engine runs without the attention signal (a warning, not a failure).
build_attention() {
  local py="${PYTHON:-../.venv/bin/python}"
  [ -x "$py" ] || py=python3
  local pkg
  pkg=$("$py" -c 'import importlib.util, os; s = importlib.util.find_spec("llama_cpp"); print(os.path.dirname(s.origin))') || return 1
  local inc="$pkg/../include" lib="$pkg/lib"
  [ -f "$inc/ggml-backend.h" ] || { echo "no ggml headers under $inc" >&2; return 1; }
  local cxx=${CXX:-c++}
  local flags="-O3 -fPIC -shared -std=c++17 -ffp-contract=off -I$inc -L$lib -Wl,-rpath,$lib"
  if ! $cxx $flags -march=native attention_capture.cpp -o "$OUT/libevoke_attention.so" -lggml-base 2>/dev/null; then
    $cxx $flags attention_capture.cpp -o "$OUT/libevoke_attention.so" -lggml-base
  fi
}
if build_attention; then
  echo "built $OUT/libevoke_attention.so"
else
  rm -f "$OUT/libevoke_attention.so"
  echo "warning: $OUT/libevoke_attention.so did not build; the attention signal is unavailable" >&2
fi
