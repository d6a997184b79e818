"""Evoke engine: llama.cpp in-process with a KV cache managed like operating-system memory.

Public API: Engine, Conversation, Settings, Reply, EngineEvent/EventKind, ConversationStats and the error
classes; no Qt here.
"""

from .conversation import Conversation
from .conversations.turn import Reply
from .engine import ConversationInfo, Engine
from .errors import (
                     BudgetError,
                     ContextFullError,
                     EditError,
                     EvokeError,
                     ImportFormatError,
                     ModelLoadError,
                     RestoreError,
)
from .events import EngineEvent, EventKind
from .settings import Settings
from .stats import ConversationStats

__all__ = ["Engine", "Conversation", "ConversationInfo", "ConversationStats", "Settings", "Reply", "EngineEvent",
           "EventKind", "EvokeError", "ModelLoadError", "BudgetError", "ContextFullError", "RestoreError", "EditError",
           "ImportFormatError"]
