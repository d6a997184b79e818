"""Evoke engine: llama.cpp in-process with a KV cache managed like operating-system memory.

Public API, the one door the window (app/) and the endpoint (server/) use (tests/unit/test_layers.py holds them to
it): Engine, Conversation, Settings, Reply, EngineEvent/EventKind, ConversationStats and the error classes; the
rules and readers the window needs without an engine (the minimum budget, what a recovery backend does, the
history read-only, search marks, the embedded model's path, private files, the model catalogue, hub search, downloads
and fit marks); what the endpoint builds requests from
(the chat template's system message, a user message's rendering, the export format, sampling grammars, the off-thread
vocabulary, a raw completion's result, engine priorities). No Qt here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it; imported on first use (PEP 562), so `import evoke_engine.settings` or the
# simulator (`benchmarks/kv_sim.py`, outside the package) does not load llama.cpp, the engine or the embedder
_HOMES = {
    "Conversation": "conversation", "Completion": "conversations.completion",
    "FORMAT_NAME": "conversations.exchange", "FORMAT_VERSION": "conversations.exchange",
    "read_conversations": "conversations.history_view", "read_messages": "conversations.history_view",
    "search_messages": "conversations.history_view", "REUSE_OWNER": "conversations.lifecycle",
    "Reply": "conversations.turn", "render_user_content": "conversations.turn",
    "ConversationInfo": "engine", "Engine": "engine",
    **dict.fromkeys(("BudgetError", "ContextFullError", "DataDirInUseError", "EditError", "EngineBusyError",
                     "EvokeError", "ImportFormatError", "ModelLoadError", "RebuildCancelled", "RestoreError"),
                    "errors"),
    "EngineEvent": "events", "EventKind": "events",
    "default_system_prompt": "kvcache.prefixes", "system_message": "kvcache.prefixes",
    "min_budget_tokens": "memory.memory", "recovery_backend": "memory.recovery", "BUNDLED_EMBEDDER": "memory.embedder",
    "default_model_path": "runtime.model_file",
    "GrammarError": "runtime.sampling", "json_grammar": "runtime.sampling", "json_schema_grammar": "runtime.sampling",
    **dict.fromkeys(("ENFORCED_SCHEMA_KEYWORDS", "SchemaRefused", "schema_grammar"), "runtime.schema_grammar"),
    "DISK_FULL": "store.store_error", "StoreError": "store.store_error",
    "VocabCounter": "runtime.vocab", "Settings": "settings", "ConversationStats": "stats",
    "MARK_END": "store.search", "MARK_START": "store.search",
    "private_mkdir": "store.private", "private_write_text": "store.private",
    **dict.fromkeys(("BACKGROUND", "FOREGROUND", "NORMAL", "Command", "Job"), "worker"),
    **dict.fromkeys(("load_catalogue", "list_gguf_files", "models_dir", "pull", "search_gguf"), "models"),
    "DownloadCancelled": "models.errors", "format_bytes": "models.errors",
    "judge_file": "models.fit_marks", "machine_marks": "models.fit_marks",
}
_RENAMED = {"recovery_backend": "backend", "BUNDLED_EMBEDDER": "BUNDLED", "ENFORCED_SCHEMA_KEYWORDS": "ENFORCED"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), _RENAMED.get(name, name))
    globals()[name] = value                   # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


if TYPE_CHECKING:                             # what type checkers and IDEs see: the same names, imported eagerly
    from .conversation import Conversation
    from .conversations.completion import Completion
    from .conversations.exchange import FORMAT_NAME, FORMAT_VERSION
    from .conversations.history_view import read_conversations, read_messages, search_messages
    from .conversations.lifecycle import REUSE_OWNER
    from .conversations.turn import Reply, render_user_content
    from .engine import ConversationInfo, Engine
    from .errors import (
        BudgetError,
        ContextFullError,
        DataDirInUseError,
        EditError,
        EngineBusyError,
        EvokeError,
        ImportFormatError,
        ModelLoadError,
        RebuildCancelled,
        RestoreError,
    )
    from .events import EngineEvent, EventKind
    from .kvcache.prefixes import default_system_prompt, system_message
    from .memory.embedder import BUNDLED as BUNDLED_EMBEDDER
    from .memory.memory import min_budget_tokens
    from .memory.recovery import backend as recovery_backend
    from .models import list_gguf_files, load_catalogue, models_dir, pull, search_gguf
    from .models.errors import DownloadCancelled, format_bytes
    from .models.fit_marks import judge_file, machine_marks
    from .runtime.model_file import default_model_path
    from .runtime.sampling import GrammarError, json_grammar, json_schema_grammar
    from .runtime.schema_grammar import ENFORCED as ENFORCED_SCHEMA_KEYWORDS
    from .runtime.schema_grammar import SchemaRefused, schema_grammar
    from .runtime.vocab import VocabCounter
    from .settings import Settings
    from .stats import ConversationStats
    from .store.private import private_mkdir, private_write_text
    from .store.search import MARK_END, MARK_START
    from .store.store_error import DISK_FULL, StoreError
    from .worker import BACKGROUND, FOREGROUND, NORMAL, Command, Job

__all__ = ["Engine", "Conversation", "ConversationInfo", "ConversationStats", "Settings", "Reply", "EngineEvent",
           "EventKind", "EvokeError", "ModelLoadError", "BudgetError", "ContextFullError", "RestoreError", "EditError",
           "ImportFormatError", "DataDirInUseError", "RebuildCancelled", "EngineBusyError",
           # for the window without an engine
           "min_budget_tokens", "recovery_backend", "read_conversations", "read_messages", "search_messages",
           "MARK_START", "MARK_END", "default_model_path", "private_mkdir", "private_write_text",
           # for the endpoint
           "Completion", "FORMAT_NAME", "FORMAT_VERSION", "REUSE_OWNER", "render_user_content", "default_system_prompt",
           "system_message", "GrammarError", "json_grammar", "json_schema_grammar", "VocabCounter", "BACKGROUND",
           "ENFORCED_SCHEMA_KEYWORDS", "SchemaRefused", "schema_grammar", "StoreError", "DISK_FULL", "BUNDLED_EMBEDDER",
           "FOREGROUND", "NORMAL",
           # the engine thread's typed jobs (`Engine.jobs`, `Engine.cancel_job`)
           "Command", "Job",
           # the window's model dialog (models/: the catalogue, hub search, downloads, fit marks)
           "load_catalogue", "list_gguf_files", "models_dir", "pull", "search_gguf", "DownloadCancelled",
           "format_bytes", "judge_file", "machine_marks"]
