"""Work-arounds for defects of the Qt binding in use, each applied only where a probe finds it.

PySide6 6.12.0 on CPython < 3.12: every `Signal.emit()` made from Python drops one reference to
`True` (not immortal before 3.12), so after a few thousand emits the process aborts with
"Fatal Python error: bool_dealloc". `guard_true_refcount` detects the leak and pads the count.
The same binding drops one reference to `None` on every call from Python into a Qt method that returns
nothing (`painter.setBrush`, `beginInsertRows`, `index.data` of an unset role...): a long chat's memory panel
(hundreds of blocks and events) aborted the app with "none_dealloc" within a turn. 6.11.3 has neither leak.
"""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, QPoint, Signal

_PAD = 1 << 40
_applied = False
_none_applied = False


class _Probe(QObject):
    fired = Signal(int)


def true_refcount_leak_per_emit(samples: int = 16) -> float:
    """How many references to True one Python-side emit drops (0 on a sound binding)."""
    probe = _Probe()
    probe.fired.connect(lambda _: None)
    before = sys.getrefcount(True)
    for i in range(samples):
        probe.fired.emit(i)
    return (before - sys.getrefcount(True)) / samples


def guard_true_refcount() -> bool:
    """Pad True's reference count when emits leak it; True when the pad was applied."""
    global _applied
    if _applied or sys.version_info >= (3, 12):
        return _applied
    if true_refcount_leak_per_emit() > 0.5:
        ctypes.c_ssize_t.from_address(id(True)).value += _PAD
        _applied = True
    return _applied


def none_refcount_leak_per_call(samples: int = 16) -> float:
    """How many references to None one Python call of a void Qt method drops (0 on a sound binding)."""
    point = QPoint()
    before = sys.getrefcount(None)
    for i in range(samples):
        point.setX(i)
    return (before - sys.getrefcount(None)) / samples


def guard_none_refcount() -> bool:
    """Pad None's reference count when void calls leak it; True when the pad was applied."""
    global _none_applied
    if _none_applied or sys.version_info >= (3, 12):
        return _none_applied
    if none_refcount_leak_per_call() > 0.5:
        ctypes.c_ssize_t.from_address(id(None)).value += _PAD
        _none_applied = True
    return _none_applied
