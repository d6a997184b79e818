"""The unit tier's shared fixture: a `Rig` (the simulated KV cache, a pool and memories built on it) closed after
each test. A test module that needs other sizes defines its own `rig`."""

from __future__ import annotations

import pytest
from helpers.rig import Rig


@pytest.fixture
def rig(tmp_path):
    rig = Rig(tmp_path)
    yield rig
    rig.close()
