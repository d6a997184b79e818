"""Conversations as files a person keeps or moves: Markdown to read, JSON to import back.

Invariants: export reads only the live history (plain rows in, text out); `parse_json` accepts
exactly what `to_json` writes (and raises ImportFormatError with the reason for anything else).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import ImportFormatError
from ..store.history import ConversationRow, MessageRow

FORMAT_NAME = "evoke-desk.conversation"
FORMAT_VERSION = 1
ROLES = ("user", "assistant", "tool")


@dataclass(frozen=True)
class ImportedMessage:
    role: str
    text: str
    attachments: list[tuple[str, str]]
    extra: dict[str, Any]


@dataclass(frozen=True)
class ImportedConversation:
    title: str
    system_prompt: str
    tools: list[dict]
    messages: list[ImportedMessage]


def to_json(conversation: ConversationRow, messages: list[MessageRow]) -> str:
    settings = conversation.settings if isinstance(conversation.settings, dict) else {}
    return json.dumps({
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "title": conversation.title,
        "system_prompt": conversation.system_prompt, "tools": settings.get("tools", []),
        "created_at": conversation.created_at,
        "messages": [{"role": m.role, "text": m.text, "created_at": m.created_at,
                      "attachments": [{"name": name, "text": body} for name, body in m.attachments],
                      **({"extra": m.extra} if m.extra else {})} for m in messages],
    }, indent=1, ensure_ascii=False)


def to_markdown(conversation: ConversationRow, messages: list[MessageRow]) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["> **System:** " + conversation.system_prompt.replace("\n", "\n> "), ""]
    for message in messages:
        lines += [f"## {message.role.capitalize()}", ""]
        for name, body in message.attachments:
            fence = "````" if "```" in body else "```"
            lines += [f"**Attached:** `{name}`", "", fence, body.rstrip("\n"), fence, ""]
        lines += [close_open_fences(message.text), ""]
    return "\n".join(lines).rstrip() + "\n"


def close_open_fences(text: str) -> str:
    """`text` with a code fence left open (a stopped reply) closed, so the export's next heading stays prose."""
    opening = None
    for line in text.splitlines():
        stripped = line.lstrip()
        fence = stripped[:len(stripped) - len(stripped.lstrip("`~"))]
        if len(fence) < 3 or len(set(fence)) != 1:
            continue
        if opening is None:
            opening = fence
        elif fence[0] == opening[0] and len(fence) >= len(opening) and not stripped[len(fence):].strip():
            opening = None
    return text if opening is None else f"{text.rstrip()}\n{opening}"


def parse_json(data: str | bytes | dict) -> ImportedConversation:
    """A conversation from `to_json`'s output; every field is checked before anything is created."""
    try:
        head = json.loads(data) if isinstance(data, str | bytes) else data
    except ValueError as exc:
        raise ImportFormatError(f"not a JSON file: {exc}") from exc
    if not isinstance(head, dict) or head.get("format") != FORMAT_NAME:
        raise ImportFormatError(f"not an Evoke Desk conversation (expected \"format\": \"{FORMAT_NAME}\")")
    if head.get("version") != FORMAT_VERSION:
        raise ImportFormatError(f"conversation file version {head.get('version')!r}; this version reads "
                                f"{FORMAT_VERSION}")
    title, system_prompt, tools = head.get("title", "Imported"), head.get("system_prompt", ""), head.get("tools", [])
    if not isinstance(title, str) or not isinstance(system_prompt, str):
        raise ImportFormatError("title and system_prompt must be text")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ImportFormatError("tools must be a list of tool schemas")
    raw_messages = head.get("messages")
    if not isinstance(raw_messages, list):
        raise ImportFormatError("messages must be a list")
    messages = []
    for i, raw in enumerate(raw_messages):
        if not isinstance(raw, dict) or raw.get("role") not in ROLES or not isinstance(raw.get("text"), str):
            raise ImportFormatError(f"message {i} needs a role ({', '.join(ROLES)}) and a text")
        attachments = raw.get("attachments", [])
        if not isinstance(attachments, list) or not all(
                isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("text"), str)
                for a in attachments):
            raise ImportFormatError(f"message {i}: attachments must be a list of {{name, text}}")
        extra = raw.get("extra", {})
        if not isinstance(extra, dict):
            raise ImportFormatError(f"message {i}: extra must be an object")
        messages.append(ImportedMessage(raw["role"], raw["text"], [(a["name"], a["text"]) for a in attachments],
                                        extra))
    return ImportedConversation(title or "Imported", system_prompt, tools, messages)
