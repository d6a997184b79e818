#!/usr/bin/env bash
# Builds the bundle's portable set of the native libraries: one native/build.sh run per CPU variant that
# evoke_engine.package_files.CPU_VARIANTS names (-march=x86-64, x86-64-v3, x86-64-v4), each into native/build/<name>/
# (or DIR/<name>: `bash native/build_variants.sh DIR`). The engine loads the best one the CPU reports; the
# -march=native build in native/build/ itself (`make install`) is left as it is and still preferred where present.
# Fails when any library of any variant did not build: the bundle is not made without one.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-native/build}")
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
case $PY in */*) PY=$(realpath -s "$PY") ;; *) PY=$(command -v "$PY") ;; esac   # the venv's, for build.sh in native/
VARIANTS=$("$PY" -P -c 'import sys; sys.path.insert(0, "."); import evoke_engine.package_files as p
print(" ".join(name for name, _ in p.CPU_VARIANTS))')
LIBRARIES=$("$PY" -P -c 'import sys; sys.path.insert(0, "."); import evoke_engine.package_files as p
print(" ".join(p.NATIVE_LIBRARIES))')
for variant in $VARIANTS; do
  MARCH=$variant PYTHON=$PY bash native/build.sh "$OUT/$variant"
  for library in $LIBRARIES; do
    [ -f "$OUT/$variant/$library" ] || { echo "$OUT/$variant/$library did not build" >&2; exit 1; }
  done
done
