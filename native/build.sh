#!/usr/bin/env bash
# Builds native/build/libevoke_rope.so (the K re-anchoring routine) with the system C compiler.
# Tuned for the CPU it is built on; the engine falls back to llama.cpp's own K-shift without it.
# `bash native/build.sh DIR` builds into DIR instead: for an installed package, the folder that
# `python -P -c 'import evoke_engine.package_files as p; print(p.native_dir())'` prints (PYTHON= that python).
# MARCH=x86-64-v3 builds for that -march instead of this CPU (no fallback): native/build_variants.sh builds the
# bundle's portable set that way.
set -euo pipefail
OUT=$(realpath -m "${1:-$(dirname "$0")/build}")
cd "$(dirname "$0")"
mkdir -p "$OUT"
CC=${CC:-cc}
MARCH=${MARCH:-native}
FLAGS="-O3 -fPIC -shared -ffp-contract=off"
# compile COMPILER FALLBACK_FLAGS ARGS...: with -march=$MARCH; for native, FALLBACK_FLAGS where the compiler lacks it
compile() {
  local compiler=$1 fallback=$2
  shift 2
  if [ "$MARCH" != native ]; then
    $compiler -march="$MARCH" "$@"
  elif ! $compiler -march=native "$@" 2>/dev/null; then
    $compiler $fallback "$@"
  fi
}
compile "$CC" -mf16c $FLAGS rope_reanchor.c -o "$OUT/libevoke_rope.so" -lm
echo "built $OUT/libevoke_rope.so"
# The 8/4-bit host tier's pack/unpack kernels (kvcache/kvquant.py checks them against its numpy path on load).
compile "$CC" -mf16c $FLAGS kvquant.c -o "$OUT/libevoke_kvquant.so" -lm
echo "built $OUT/libevoke_kvquant.so"

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
  compile "$cxx" "" $flags attention_capture.cpp -o "$OUT/libevoke_attention.so" -lggml-base
}
if build_attention; then
  echo "built $OUT/libevoke_attention.so"
else
  rm -f "$OUT/libevoke_attention.so"
  echo "warning: $OUT/libevoke_attention.so did not build; the attention signal is unavailable" >&2
fi

# The direct KV data path (issue 43): block copies between the cache's layer tensors and host bytes. It reads
# llama.cpp's cell table through the internal headers of the very sources the installed wheel was built from (the
# sdist native/llama_wheel.sh unpacks into build/llama-src; EVOKE_LLAMA_SRC names another vendor/llama.cpp).
# Optional: without it the engine keeps the serialised state path (a log line says so).
build_kv_direct() {
  local py="${PYTHON:-../.venv/bin/python}"
  [ -x "$py" ] || py=python3
  local pkg version src=""
  pkg=$("$py" -c 'import importlib.util, os; s = importlib.util.find_spec("llama_cpp"); print(os.path.dirname(s.origin))') || return 1
  version=$("$py" -c 'import llama_cpp; print(llama_cpp.__version__)') || return 1
  local inc="$pkg/../include" lib="$pkg/lib" candidate
  for candidate in "${EVOKE_LLAMA_SRC:-}" "../build/llama-src/llama_cpp_python-$version/vendor/llama.cpp" \
                   /tmp/gk-b/llama_cpp_python-"$version"/vendor/llama.cpp; do
    if [ -n "$candidate" ] && [ -f "$candidate/src/llama-kv-cache.h" ]; then src=$candidate; break; fi
  done
  [ -n "$src" ] || { echo "no llama.cpp $version sources (build/llama-src; EVOKE_LLAMA_SRC)" >&2; return 1; }
  local cxx=${CXX:-c++}
  local flags="-O3 -DNDEBUG -fPIC -shared -std=c++17 -ffp-contract=off -I$inc -I$src/include -I$src/ggml/include -I$src/src -L$lib -Wl,-rpath,$lib"
  compile "$cxx" -mf16c $flags kv_direct.cpp -o "$OUT/libevoke_kvdirect.so" -lllama -lggml-base -pthread
}
if build_kv_direct; then
  echo "built $OUT/libevoke_kvdirect.so"
else
  rm -f "$OUT/libevoke_kvdirect.so"
  echo "warning: $OUT/libevoke_kvdirect.so did not build; KV blocks move through llama.cpp's serialised state" >&2
fi
