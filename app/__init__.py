"""Evoke Desk's PySide6 desktop app: window, widgets, dialogs and the bridge to the engine.

Invariant: no policy lives here (the engine decides); no engine call runs on the GUI thread.
"""

from .qtcompat import guard_none_refcount, guard_true_refcount

guard_true_refcount()   # before any signal is emitted (see qtcompat)
guard_none_refcount()   # before any Qt call (see qtcompat)
