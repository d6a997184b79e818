"""Builds native/build/libevoke_attention.so for the attention tests when it is missing or older than its source."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "native" / "attention_capture.cpp"
LIBRARY = ROOT / "native" / "build" / "libevoke_attention.so"


def ensure_library() -> None:
    if LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return
    done = subprocess.run(["bash", str(ROOT / "native" / "build.sh")], capture_output=True, text=True)
    if not LIBRARY.exists():
        pytest.fail(f"native/build.sh did not build {LIBRARY.name}:\n{done.stdout}\n{done.stderr}")
