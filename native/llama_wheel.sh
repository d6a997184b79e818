#!/usr/bin/env bash
# Sourced by build_cpu.sh and build_cuda.sh: builds the pinned llama-cpp-python wheel from its sdist into
# $EVOKE_WHEEL_CACHE (default ~/.cache/evoke-desk/llama-wheels)/<variant>-<version>-<hash>/ and installs it into
# .venv once per flag set. pip's own wheel cache is keyed by the sdist alone, so a change of CMAKE_ARGS there
# silently reuses a wheel built with other flags; here the hash covers the CMake flags, the machine and its CPU
# flags (the CPU wheel is built with -march=native), and a wheel is never rebuilt while its folder holds one.
# The cache lives outside the checkout, so a fresh clone (CI) on the same machine reuses it as it did pip's.
# `.venv/.llama-wheel` names the wheel installed, so a re-run installs nothing. (build_cuda.sh keeps its own
# build/wheels/cuda-*/ folders, named by CUDA version and architectures, and only uses llama_wheel_install.)
#
#   llama_wheel_dir VARIANT ARGS      prints the folder for these flags
#   llama_wheel_build VARIANT ARGS    builds into it when it holds no wheel (the compile log sits beside it)
#   llama_wheel_install DIR           installs the folder's wheel unless it is the one installed
set -euo pipefail
LLAMA_PY=${LLAMA_PY:-.venv/bin/python}
LLAMA_VERSION=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml | cut -d= -f3)
LLAMA_SRC_ROOT=build/llama-src

llama_sdist() {           # the unpacked sdist (vendor/llama.cpp inside), downloaded once
  local dir="$LLAMA_SRC_ROOT/llama_cpp_python-$LLAMA_VERSION"
  if [ ! -f "$dir/CMakeLists.txt" ]; then
    mkdir -p "$LLAMA_SRC_ROOT"
    $LLAMA_PY -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_VERSION" \
      -d "$LLAMA_SRC_ROOT" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
    tar xzf "$LLAMA_SRC_ROOT/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$LLAMA_SRC_ROOT"
  fi
  echo "$dir"
}

LLAMA_WHEEL_CACHE=${EVOKE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/evoke-desk/llama-wheels}

llama_wheel_dir() {
  local hash
  hash=$( { printf '%s\n' "$2"; uname -m; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true; } | sha256sum | cut -c1-12)
  echo "$LLAMA_WHEEL_CACHE/$1-$LLAMA_VERSION-$hash"
}

llama_wheel_build() {
  local variant=$1 args=$2 dir src start
  dir=$(llama_wheel_dir "$variant" "$args")
  if ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then return 0; fi
  src=$(llama_sdist)
  mkdir -p "$dir"
  printf '%s\n' "$args" >"$dir/cmake-args.txt"
  echo "building llama-cpp-python $LLAMA_VERSION ($variant: $args) into $dir" >&2
  start=$(date +%s)
  # A kept CMake folder: an interrupted build resumes instead of starting over in a temp folder.
  CMAKE_ARGS="$args" FORCE_CMAKE=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    $LLAMA_PY -m pip wheel -v --no-deps --no-cache-dir -w "$dir" -C build-dir="$PWD/build/cmake/$(basename "$dir")" \
    "./$src" >"$dir.log" 2>&1 \
    || { tail -40 "$dir.log" >&2; echo "llama-cpp-python build failed; whole log: $dir.log" >&2; exit 1; }
  echo "built in $(( $(date +%s) - start )) s: $(ls "$dir"/*.whl)" >&2
}

llama_wheel_install() {
  local wheel marker=.venv/.llama-wheel
  wheel=$(ls "$1"/llama_cpp_python-*.whl | head -1)
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$wheel" ] && $LLAMA_PY -c "import llama_cpp" 2>/dev/null; then
    return 0
  fi
  if $LLAMA_PY -c "import llama_cpp" 2>/dev/null; then
    $LLAMA_PY -m pip install -q --force-reinstall --no-deps "$wheel"     # swap the build, keep its dependencies
  else
    $LLAMA_PY -m pip install -q "$wheel"                                 # a fresh venv: its dependencies too
  fi
  echo "$wheel" >"$marker"
}
