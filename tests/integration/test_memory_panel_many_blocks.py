"""The memory panel with a long chat's worth of blocks and events: laid out and painted without aborting the
process (PySide6 6.12.0 on Python 3.11 drops a reference to None per void Qt call: app/qtcompat.py)."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.gui


def test_many_void_qt_calls_cannot_exhaust_none(qapp):
    from app import qtcompat

    qtcompat.guard_none_refcount()
    leak = qtcompat.none_refcount_leak_per_call()
    assert leak == 0 or sys.getrefcount(None) > 1 << 39     # PySide6 6.12.0 on 3.11: padded


def test_the_panel_shows_300_blocks_and_a_full_event_list_in_colour(qtbot):
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor

    from app.item_models import EVENT_COLORS, BlockTableModel, EventLogModel
    from app.widgets.memory_panel import MemoryPanel

    events, blocks = EventLogModel(), BlockTableModel()
    panel = MemoryPanel(blocks, events)
    qtbot.addWidget(panel)
    panel.resize(420, 900)
    panel.show()
    states = ("resident", "ram", "disk")
    for refresh in range(5):                     # stats refreshes while a reply streams
        blocks.set_blocks([{"name": f"file#{i}", "state": states[(i + refresh) % 3], "tokens": 16}
                           for i in range(300)])
        for i in range(150):
            events.append("evicted" if i % 2 else "recovered", f"evicted file#{i} (16 tokens)")
        panel.grab()
    assert len(panel.block_rows()) == 300 and events.rowCount() == events.limit
    last = events.index(events.rowCount() - 1, 0)
    assert events.data(last, Qt.ItemDataRole.ForegroundRole) == QColor(EVENT_COLORS[events.rows[-1].kind])
    qtbot.wait_until(lambda: panel.events.visualRect(last).height() > 0)
