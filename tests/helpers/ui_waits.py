"""How long a window test's wait may take before it counts as broken (issue 63).

Window tests wait for the window's state (a signal, a condition), never for time: a wait's time limit is only a
ceiling for a broken test, so it is generous enough for a machine under full load (`make test-loaded`), where
pytest-qt's 5 s default failed waits that succeed seconds later. A wait still ends as soon as its condition holds.
"""

from __future__ import annotations

UI_WAIT_MS = 120_000


def generous_qt_waits() -> None:
    """pytest-qt's waits (waitUntil, waitSignal, waitSignals, waitCallback and their snake_case names) default to
    `UI_WAIT_MS` instead of 5 s."""
    from pytestqt.qtbot import QtBot

    for wait in (QtBot.waitUntil, QtBot.waitSignal, QtBot.waitSignals, QtBot.waitCallback):
        if wait.__kwdefaults__ and "timeout" in wait.__kwdefaults__:
            wait.__kwdefaults__["timeout"] = UI_WAIT_MS
