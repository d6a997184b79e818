"""Work-arounds for defects of the Qt binding in use, each applied only where a probe finds it.

PySide6 6.12.0 on CPython < 3.12: every `Signal.emit()` made from Python drops one reference to
`True` (not immortal before 3.12), so after a few thousand emits the process aborts with
"Fatal Python error: bool_dealloc". `guard_true_refcount` detects the leak and pads the count.
"""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal

_PAD = 1 << 40
_applied = False


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
