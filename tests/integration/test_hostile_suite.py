"""The hostile suite (tests/helpers/hostile_suite.py) as a soak test: every case gets its written-down status, with no
5xx, no hang, no lost message and no leaked byte (`make test-hostile` prints the counts)."""

from __future__ import annotations

import pytest
from helpers.hostile_suite import main


@pytest.mark.soak
def test_the_hostile_suite_passes_every_case(capsys):
    assert main(["--quick", "--json"]) == 0, capsys.readouterr().out
