#!/usr/bin/env bash
# Puts the CPU build of llama-cpp-python back into .venv (pip's cached wheel; a compile the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml | cut -d= -f3)
.venv/bin/python -m pip install -q --force-reinstall --no-deps "llama-cpp-python==$VERSION"
bash native/build.sh
.venv/bin/python -m evoke_engine device
