"""Issue 62, first item: every native file the engine loads is named once, in `package_files.NATIVE_FILES`, and the
bundle's spec copies exactly that list (it names no library of its own and stops when one is missing), so a new
library cannot be left out of the double-click app again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evoke_engine import package_files

ROOT = Path(__file__).resolve().parents[2]


def test_every_native_file_the_engine_names_is_listed():
    named = set()
    for path in (ROOT / "evoke_engine").rglob("*.py"):
        named |= set(re.findall(r'"(libevoke_\w+\.so|rpc-server)"', path.read_text(encoding="utf-8")))
    built = {match for script in (ROOT / "native").glob("build*.sh")
             for match in re.findall(r"(libevoke_\w+\.so)", script.read_text(encoding="utf-8"))}
    assert named and named <= set(package_files.NATIVE_FILES)
    assert built <= set(package_files.NATIVE_FILES), built - set(package_files.NATIVE_FILES)


def test_an_unlisted_library_is_refused_by_name():
    with pytest.raises(ValueError, match="NATIVE_FILES"):
        package_files.native_library("libevoke_new.so")


def test_the_spec_copies_the_engines_list_and_stops_when_a_file_is_missing():
    spec = (ROOT / "packaging" / "evoke-desk.spec").read_text(encoding="utf-8")
    code = "\n".join(line for line in spec.splitlines() if not line.lstrip().startswith("#"))
    assert "from evoke_engine.package_files import NATIVE_FILES" in code
    assert not re.search(r'"libevoke_\w+\.so"', code)               # no list of its own
    assert "raise SystemExit" in code
