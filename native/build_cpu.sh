#!/usr/bin/env bash
# Builds the CPU llama-cpp-python (with llama.cpp's RPC backend, GGML_RPC=ON) into build/wheels/cpu-*/ once
# per flag set and installs it into .venv, then the native libraries and rpc-server against it.
# EVOKE_LLAMA_CMAKE_ARGS adds CMake flags (a new flag set is a new wheel); EVOKE_WHEEL_ONLY=1 stops after the wheel.
# First build: about 5 minutes on 2 cores; later runs reuse the wheel (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
source native/llama_wheel.sh
ARGS="-DGGML_RPC=ON ${EVOKE_LLAMA_CMAKE_ARGS:-}"
ARGS=${ARGS% }
llama_wheel_build cpu "$ARGS"
llama_wheel_install "$(llama_wheel_dir cpu "$ARGS")"
[ -n "${EVOKE_WHEEL_ONLY:-}" ] && exit 0
bash native/build.sh
bash native/build_rpc_server.sh
.venv/bin/python -m evoke_engine device
