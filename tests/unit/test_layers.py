"""Issue 25's layering rule, checked on the source: below engine.py no module refers to `Engine` (imports or
annotations); the conversation handle, the package entry points, the server and the benches may."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import evoke_engine

pytestmark = pytest.mark.unit

PACKAGE = Path(evoke_engine.__file__).resolve().parent
NAMES_ENGINE = re.compile(r"import .*\bEngine\b|[:(\[,] *['\"]?Engine['\"]?\b")
ALLOWED = {"engine.py", "conversation.py", "__init__.py", "__main__.py"}
ALLOWED_FOLDERS = {"server", "bench"}


def test_no_module_below_the_engine_names_it():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ALLOWED_FOLDERS or (len(relative.parts) == 1 and relative.name in ALLOWED):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NAMES_ENGINE.search(line):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert offenders == []


def test_the_conversation_handle_calls_only_public_engine_methods():
    source = (PACKAGE / "conversation.py").read_text(encoding="utf-8")
    used = set(re.findall(r"self\.engine\.(\w+)", source))
    assert used and all(not name.startswith("_") for name in used)
    assert not used & {"history", "thread", "lifecycle", "model", "turns"}, "engine-thread state, not methods"
