"""llama.cpp's own logging routed to Python's: errors to the `evoke_engine.runtime.runtime` logger, the rest dropped.

Invariants: the callback is installed once per process and kept referenced for the process's life (llama.cpp holds
only its pointer); this module imports nothing of the runtime, so every other runtime module may call it.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp as ll

log = logging.getLogger("evoke_engine.runtime.runtime")

_GGML_LOG_LEVEL_ERROR = 4
_log_callback = None


def quiet_llama_logs() -> None:
    """Route llama.cpp's own logging to Python's logger at debug level (set once per process)."""
    global _log_callback
    if _log_callback is not None:
        return

    @ll.llama_log_callback
    def _cb(level, text, user_data):
        if level == _GGML_LOG_LEVEL_ERROR:
            log.error("llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

    _log_callback = _cb
    ll.llama_log_set(_cb, ctypes.c_void_p(0))
