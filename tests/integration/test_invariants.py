"""Invariant and input checks raise real errors, so they hold under `python -O` too (no llama.cpp)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECKS = """
from evoke_engine.kvcache.blocks import Block, BlockState, BlockTable
from evoke_engine.errors import InvariantError
from evoke_engine.kvcache.slots import SlotRegistry

def raises(kind, fn):
    try:
        fn()
    except kind:
        return
    raise SystemExit(f"no {kind.__name__} from {fn}")

slots = SlotRegistry(2)
slots.pin("a", 0)
raises(InvariantError, lambda: slots.pin("b", 0))
raises(InvariantError, lambda: slots.pin("a", 1))
block = Block(name="b", role="file", turn=1, tokens=[1, 2], text="b")
raises(InvariantError, lambda: block.end)
table = BlockTable()
table.append(block)
block.pos = 5
raises(InvariantError, table.check)
shared = Block(name="s", role="system", turn=0, tokens=[1], text="s", shared=True)
raises(InvariantError, lambda: BlockTable().remove_resident(shared, BlockState.DROPPED))
print("ok")
"""


def test_checks_raise_real_errors_under_python_O():
    out = subprocess.run([sys.executable, "-O", "-c", CHECKS], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
