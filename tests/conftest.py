"""Shared fixtures and the two tiers: tests/unit (no model, marker `unit`) and tests/integration (the real
embedded model, pytest-qt, end to end: marker `model`, added here to every test collected there)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from helpers.ui_waits import generous_qt_waits  # noqa: E402 - after the environment above

generous_qt_waits()


@pytest.fixture
def restore_logging():
    """Handlers a test adds to the root logger (configure_logging) are closed and removed after it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def evoke_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("evoke-home")
    os.environ["EVOKE_HOME"] = str(home)
    return home


def pytest_configure(config):
    """The unit tier (`-m unit`, or only tests/unit named: `make test-fast`) proves its promise: loading a llama.cpp
    model fails there."""
    named = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    only_unit = bool(named) and all(path == UNIT or UNIT in path.parents for path in named)
    if config.getoption("markexpr", "") == "unit" or only_unit:
        import llama_cpp

        def refuse(*_args, **_kwargs):
            raise RuntimeError("the unit tier loads no llama.cpp model: mark this test otherwise")
        llama_cpp.llama_model_load_from_file = refuse


INTEGRATION = Path(__file__).resolve().parent / "integration"
UNIT = INTEGRATION.parent / "unit"


@pytest.hookimpl(tryfirst=True)                 # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Tests under tests/integration get the `model` marker, those under tests/unit the `unit` marker. `gpu`
    tests skip where llama.cpp has no GPU to run on; `cuda_build` tests where the installed llama.cpp is the CPU
    build (each with the reason)."""
    from evoke_engine.runtime import device

    for item in items:
        folders = Path(str(item.fspath)).resolve().parents
        if INTEGRATION in folders:
            item.add_marker(pytest.mark.model)
        elif UNIT in folders:
            item.add_marker(pytest.mark.unit)

    reasons = {"gpu": None if device.detect().on_gpu else "needs a CUDA build of llama.cpp and a GPU",
               "cuda_build": None if device.cuda_build() else "needs the CUDA build of llama.cpp (make gpu)"}
    for item in items:
        for marker, reason in reasons.items():
            if reason and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=reason))



@pytest.fixture(autouse=True, scope="module")
def _close_leftover_windows():
    """A test module leaves no top-level window behind: a settings dialog left open by one module would be the
    active window of the next and take its keystrokes (CI saw focus land on a leftover dialog's tab bar)."""
    yield
    import sys

    if "PySide6.QtWidgets" not in sys.modules:
        return
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        return
    for widget in app.topLevelWidgets():
        if widget.isVisible():
            widget.close()
    app.processEvents()
