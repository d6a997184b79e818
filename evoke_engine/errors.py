"""Errors the engine reports to its callers, each with a message a user can act on.

Invariant: environment problems (missing file, full disk, no memory) are these classes;
anything else escaping the engine is a bug.
"""


class EvokeError(Exception):
    """Base of every error the engine raises on purpose."""


class ModelLoadError(EvokeError):
    """The model file is missing, is not GGUF, or llama.cpp refused it."""


class BudgetError(EvokeError):
    """The budget cannot hold what must stay resident (e.g. the shared prefix)."""


class EngineBusyError(EvokeError):
    """Every slot holds a reply being written: a conversation cannot enter one until a reply ends."""


class ContextFullError(EvokeError):
    """The context has no free cells for the tokens that must be decoded."""


class DecodeError(ContextFullError):
    """llama_decode refused a batch (`rc`): the context is full, or the decode was aborted or malformed."""

    def __init__(self, rc: int, n_ctx: int) -> None:
        reason = {1: "the context is full (no free KV cells)", 2: "aborted", -1: "invalid batch"}.get(
            rc, f"llama_decode returned {rc}")
        super().__init__(f"decode failed: {reason}; the context holds {n_ctx} tokens. "
                         "Raise the context length, lower the budget or the slot count, or turn eviction on.")
        self.rc = rc


class Cancelled(Exception):  # noqa: N818 - a stop asked for, not a failure
    """Generation or decoding stopped at the caller's request."""


class RestoreError(EvokeError):
    """Saved K/V bytes could not be spliced back (llama.cpp rejected them)."""


class EditError(EvokeError):
    """A conversation edit that cannot apply (no such message, wrong role, a history the template refuses)."""


class InvariantError(AssertionError):
    """Engine state broke one of its invariants (a bug, not the environment). Raised explicitly, so it
    survives `python -O`; an AssertionError so callers and tests that expect one still catch it."""


class RebuildCancelled(EvokeError):
    """Opening a conversation was cancelled while its KV was rebuilt from history (nothing of it stays open;
    SQLite is unchanged and the next open rebuilds it again)."""


class ImportFormatError(EvokeError):
    """An imported conversation file is not one this version can read."""


class DataDirInUseError(EvokeError):
    """Another Evoke Desk process (the window, `serve`, `chat`) or engine owns the data folder."""

    def __init__(self, folder: object) -> None:
        self.folder = folder
        super().__init__(f"another Evoke Desk (a window, `serve` or `chat`) is using the data folder {folder}; "
                         "one process owns a data folder at a time: close the other one first, or give this one "
                         "another folder with EVOKE_HOME")
