"""Shared fixtures: one real runtime and one engine per test session, isolated dirs, Qt offscreen."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def evoke_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("evoke-home")
    os.environ["EVOKE_HOME"] = str(home)
    return home
