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


class ContextFullError(EvokeError):
    """The context has no free cells for the tokens that must be decoded."""


class RestoreError(EvokeError):
    """Saved K/V bytes could not be spliced back (llama.cpp rejected them)."""


class EditError(EvokeError):
    """A conversation edit that cannot apply (no such message, wrong role, a history the template refuses)."""


class ImportFormatError(EvokeError):
    """An imported conversation file is not one this version can read."""
