#!/usr/bin/env bash
# Builds llama-cpp-python with CUDA and llama.cpp's RPC backend (backends loaded at run time, so one build runs
# with or without a GPU) into build/wheels/cuda-*/ and installs it into .venv; a wheel already built is reused.
# EVOKE_CUDA_BUILD_ONLY=1 stops before installing it and prints the wheel's folder on stdout (the CUDA bundle,
# packaging/build_bundle.sh, takes it from there), EVOKE_WHEEL_ONLY=1 right after (packaging/install.sh).
# EVOKE_CUDA_PYTHON: the venv whose pip builds the wheel and holds the NVIDIA packages (default .venv; the bundle's
# build venv for the CUDA bundle, whose spec copies the CUDA runtime and cuBLAS from there).
# EVOKE_CUDA_DRY_RUN=1 prints what would be built (compiler, architectures, CMake flags, wheel folder) and stops
# before installing or compiling anything. Messages go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${EVOKE_CUDA_PYTHON:-.venv/bin/python}
DRY=${EVOKE_CUDA_DRY_RUN:-}
VERSION=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml | cut -d= -f3)
ARCHS=${EVOKE_CUDA_ARCHS:-"75-real;86-real;89-real;120-real;120-virtual"}   # RTX 20xx..50xx + PTX

# The CUDA compiler: the system's, or PyPI's NVIDIA packages where a machine has only a driver.
NVCC=${NVCC:-$(command -v nvcc || true)}
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ] && [ -n "$DRY" ]; then
  echo "dry run: no system nvcc; a real run installs nvidia-cuda-nvcc 13.0 from PyPI (assumed below)" >&2
elif [ -z "$NVCC" ]; then
  echo "no system nvcc: installing the CUDA compiler from PyPI" >&2
  $PY -m pip install -q "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
  NVCC=$($PY -c "import nvidia, pathlib; print(next(pathlib.Path(nvidia.__path__[0]).glob('cu13/bin/nvcc')))")
fi
if [ -n "$NVCC" ]; then
  CUDA_MM=$("$NVCC" --version 2>/dev/null | grep -oE 'release [0-9]+\.[0-9]+' | cut -d' ' -f2 || true)
  [ -n "$CUDA_MM" ] || { echo "$NVCC --version names no CUDA release: set NVCC to a working nvcc" >&2; exit 1; }
  # the toolkit nvcc itself runs from (a wrapper script such as /usr/local/bin/nvcc does not sit in it)
  TOP=$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1 || true)
  CUDA_ROOT=$(cd "${TOP:-$(dirname "$NVCC")/..}" && pwd)
  [ -x "$CUDA_ROOT/bin/nvcc" ] && NVCC=$CUDA_ROOT/bin/nvcc          # CMake gets the compiler, not the wrapper
else
  NVCC="<PyPI nvcc>" CUDA_MM=13.0 CUDA_ROOT="<PyPI nvcc>/.."
fi
echo "nvcc $CUDA_MM at $NVCC" >&2

# cuBLAS and the CUDA runtime from PyPI: headers for the build, libraries the app preloads at run time.
if [ -n "$DRY" ]; then
  CU_DIR="<$PY's site-packages>/nvidia/cu${CUDA_MM%%.*}"
else
  $PY -m pip install -q "nvidia-cublas==$CUDA_MM.*" "nvidia-cuda-runtime==$CUDA_MM.*"
  CU_DIR=$($PY -c "import nvidia, pathlib; print(next(pathlib.Path(nvidia.__path__[0]).glob('cu*/lib')).parent)")
fi

TAG="$VERSION-cuda$CUDA_MM-rpc-$(echo "$ARCHS" | tr ';' '_')"        # the flags that vary, in the name
WHEEL_DIR=build/wheels/cuda-$TAG
if ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  ARGS="-DGGML_CUDA=on -DGGML_RPC=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCHS"
  ARGS="$ARGS -DCMAKE_CUDA_COMPILER=$NVCC -DCUDAToolkit_ROOT=$CUDA_ROOT"
  ARGS="$ARGS -DCUDA_cublas_LIBRARY=$CU_DIR/lib/libcublas.so.${CUDA_MM%%.*}"
  ARGS="$ARGS -DCUDA_cublasLt_LIBRARY=$CU_DIR/lib/libcublasLt.so.${CUDA_MM%%.*}"
  # llama.cpp's VMM pool links the driver library; a build machine without a driver builds without it.
  DRIVER=$(ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 "$CUDA_ROOT"/lib64/stubs/libcuda.so 2>/dev/null | head -1 || true)
  if [ -n "$DRIVER" ]; then ARGS="$ARGS -DCUDA_cuda_driver_LIBRARY=$DRIVER"; else ARGS="$ARGS -DGGML_CUDA_NO_VMM=ON"; fi
  if [ -n "$DRY" ]; then
    printf 'dry run: would build llama-cpp-python %s into %s\n  CMAKE_ARGS=%s\n' "$VERSION" "$WHEEL_DIR" "$ARGS" >&2
    echo "$WHEEL_DIR"
    exit 0
  fi
  echo "building llama-cpp-python $VERSION with CUDA for $ARCHS (slow: ~190 CUDA files per architecture)" >&2
  start=$(date +%s)
  mkdir -p "$WHEEL_DIR"
  # Built from a kept source tree into a kept CMake folder, so an interrupted build (most of an hour
  # on 2 cores per architecture) resumes where it stopped instead of starting over in a temp folder.
  SRC_DIR=build/cuda-src
  if [ ! -d "$SRC_DIR/llama_cpp_python-$VERSION" ]; then
    mkdir -p "$SRC_DIR"
    $PY -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$SRC_DIR"
    tar xzf "$SRC_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$SRC_DIR"
  fi
  CPATH="$CU_DIR/include${CPATH:+:$CPATH}" CMAKE_ARGS="$ARGS ${CMAKE_ARGS:-}" FORCE_CMAKE=1 \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    $PY -m pip wheel -v --no-deps --no-cache-dir -w "$WHEEL_DIR" -C build-dir="$PWD/build/cuda-cmake/$TAG" \
    "./$SRC_DIR/llama_cpp_python-$VERSION" >"$WHEEL_DIR.log" 2>&1 \
    || { tail -40 "$WHEEL_DIR.log" >&2; echo "CUDA build failed; whole log: $WHEEL_DIR.log" >&2; exit 1; }
  # llama-cpp-python installs the CPU backend only under its plain name; with every CPU variant built
  # as its own module, the wheel gets them from the build folder (llama.cpp picks the best at start).
  UNPACKED=$(mktemp -d)
  $PY -m wheel unpack -d "$UNPACKED" "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null
  cp build/cuda-cmake/"$TAG"/bin/libggml-cpu-*.so "$UNPACKED"/llama_cpp_python-*/llama_cpp/lib/
  # Its install also puts the backend modules in a top-level bin/ (site-packages/bin, which nothing
  # loads from): a second 112 MB copy of libggml-cuda.so. The wheel keeps llama_cpp/lib only.
  rm -rf "$UNPACKED"/llama_cpp_python-*/bin
  rm "$WHEEL_DIR"/llama_cpp_python-*.whl
  $PY -m wheel pack -d "$WHEEL_DIR" "$UNPACKED"/llama_cpp_python-* >/dev/null
  rm -rf "$UNPACKED"
  echo "built in $(( $(date +%s) - start )) s: $(du -h "$WHEEL_DIR"/*.whl | cut -f1) $(ls "$WHEEL_DIR"/*.whl)" >&2
elif [ -n "$DRY" ]; then
  echo "dry run: $WHEEL_DIR already holds the wheel (reused)" >&2
fi
if [ -n "${EVOKE_CUDA_BUILD_ONLY:-}$DRY" ]; then echo "$WHEEL_DIR"; exit 0; fi
source native/llama_wheel.sh
llama_wheel_install "$WHEEL_DIR"
[ -n "${EVOKE_WHEEL_ONLY:-}" ] && exit 0
bash native/build.sh
bash native/build_rpc_server.sh
$PY -m evoke_engine device
