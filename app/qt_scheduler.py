"""APScheduler inside the Qt event loop: the wake-up timer always lives on the GUI thread.

Invariant: `_start_timer` may be called from any thread (jobs are added by the engine thread);
the QTimer is only touched on the GUI thread, and jobs run in APScheduler's executor pool.
"""

from __future__ import annotations

from apscheduler.schedulers.qt import QtScheduler
from PySide6.QtCore import QObject, QTimer, Signal


class _TimerHost(QObject):
    rearm = Signal(object)           # seconds to wait, or None to stop

    def __init__(self, fire) -> None:
        super().__init__()
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(fire)
        self.rearm.connect(self._rearm)          # queued when emitted off the GUI thread

    def _rearm(self, wait_seconds: float | None) -> None:
        self._timer.stop()
        if wait_seconds is not None:
            self._timer.start(min(int(wait_seconds * 1000), 2_147_483_647))

    @property
    def active(self) -> bool:
        return self._timer.isActive()


class QtEventLoopScheduler(QtScheduler):
    """QtScheduler whose timer is thread-safe (stock QtScheduler assumes the GUI thread)."""

    def __init__(self, **options) -> None:
        self._host = _TimerHost(self._process_jobs)   # before super(): start() may rearm
        super().__init__(**options)

    def _start_timer(self, wait_seconds: float | None) -> None:
        self._host.rearm.emit(wait_seconds)

    def _stop_timer(self) -> None:
        self._host.rearm.emit(None)
