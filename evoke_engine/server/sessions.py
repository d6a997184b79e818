"""Requests as canonical messages, how they line up with a conversation, and the session table.

Invariants: a request and a conversation are compared as (role, content) with content exactly what the
engine puts in its template history, so agreement means the cached KV is the request's prefix; a plan
continues a conversation only when the request extends all of it, and otherwise forks at the last
agreeing reply (never reuses a cache that disagrees). Session ids are JSON keys, never file names.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..turn import render_user_content
from .errors import ApiError
from .models import ChatMessage, ChatRequest
from .toolcalls import ParsedCall, RawTextMap, canonical_arguments

SESSION_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
CONVERSATION_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Msg:
    role: str                      # user | assistant | tool
    content: str                   # what the template history holds
    text: str = ""                 # the input's own text (without rendered attachments)
    attachments: list[tuple[str, str]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)      # tool_call_id / name of a tool result
    keep: str | None = None        # evoke_keep

    @property
    def key(self) -> tuple[str, str]:
        return self.role, self.content


@dataclass
class CanonicalRequest:
    system: str | None
    messages: list[Msg]


def _decode_file(data: str | None) -> str:
    if not data:
        return ""
    if data.startswith("data:") and ";base64," in data:
        try:
            return base64.b64decode(data.split(";base64,", 1)[1], validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError) as exc:
            raise ApiError(400, f"file_data is not valid base64: {exc}", "invalid_file") from exc
    return data


def _parts(message: ChatMessage) -> tuple[str, list[tuple[str, str]]]:
    content = message.content
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts, files = [], []
    for i, part in enumerate(content):
        if part.type in ("text", "input_text"):
            texts.append(part.text or "")
        elif part.type == "file" and part.file is not None:
            files.append((part.file.filename or f"file{i}", _decode_file(part.file.file_data)))
        else:
            raise ApiError(400, f"content part of type {part.type!r} is not supported by this model "
                                "(text and file parts are)", "unsupported_content", "messages")
    return "\n".join(texts), files


def canonicalize(request: ChatRequest, raw_map: RawTextMap) -> CanonicalRequest:
    """Leading system messages become the system prompt; consecutive inputs merge into one input."""
    systems, out = [], []
    for message in request.messages:
        role = message.role
        text, files = _parts(message)
        if role in ("system", "developer") and not out:
            systems.append(text)
            continue
        if role == "assistant":
            calls = message.tool_calls or []
            if calls:
                parsed = [ParsedCall(c.function.name, canonical_arguments(c.function.arguments) or "{}")
                          for c in calls]
                text = raw_map.raw_text(text or None, parsed, [c.id for c in calls])
            out.append(Msg("assistant", text, text, keep=message.evoke_keep))
            continue
        role = "tool" if role in ("tool", "function") else "user"
        extra = {"tool_call_id": message.tool_call_id, "name": message.name} if role == "tool" else {}
        if out and out[-1].role != "assistant":      # merge consecutive inputs: one engine turn
            prev = out[-1]
            prev.text = f"{prev.text}\n\n{text}" if prev.text else text
            prev.attachments += files
            prev.content = render_user_content(prev.text, prev.attachments)
            prev.keep = prev.keep or message.evoke_keep
            continue
        out.append(Msg(role, render_user_content(text, files), text, files,
                       {k: v for k, v in extra.items() if v}, message.evoke_keep))
    return CanonicalRequest("\n\n".join(systems) if systems else None, out)


def conversation_messages(rows: list[dict]) -> list[Msg]:
    """A conversation's messages (Conversation.messages()) in canonical form."""
    out = []
    for row in rows:
        role = row["role"] if row["role"] in ("assistant", "tool") else "user"
        attachments = [tuple(a) for a in row.get("attachments") or []]
        content = row["text"] if role == "assistant" else render_user_content(row["text"], attachments)
        out.append(Msg(role, content, row["text"], attachments))
    return out


def agreement(conversation: list[Msg], request: list[Msg]) -> int:
    n = 0
    for a, b in zip(conversation, request, strict=False):
        if a.key != b.key:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Plan:
    action: str                    # continue | fork | new
    keep: int                      # conversation messages kept (fork: messages[:keep])
    tail: list[Msg]


def plan(conversation: list[Msg], request: list[Msg]) -> Plan:
    """How `request` lines up with `conversation`: continue it, fork at the last agreeing reply, or start anew."""
    k = agreement(conversation, request)
    if k == len(conversation) and k < len(request):
        return Plan("continue", k, request[k:])
    j = min(k, len(request) - 1)
    while j > 0 and conversation[j - 1].role != "assistant":
        j -= 1
    return Plan("fork" if j > 0 else "new", j, request[j:])


def check_tail(tail: list[Msg]) -> Msg:
    """The input message the request ends with (the turn to run)."""
    if not tail or tail[-1].role == "assistant":
        raise ApiError(400, "the last message must be from the user or a tool", "invalid_messages", "messages")
    return tail[-1]


class SessionMap:
    """Client session id -> conversation id, kept in one JSON file (atomic replace)."""

    def __init__(self, path: Path, raw_map: RawTextMap) -> None:
        self.path = path
        self.raw_map = raw_map
        self._lock = threading.Lock()
        self._map: dict[str, str] = {}
        try:
            data = json.loads(path.read_text())
            self._map = {str(k): str(v) for k, v in data.get("sessions", {}).items()}
            raw_map.load(data.get("raw_text", {}))
        except (OSError, ValueError, AttributeError):
            pass

    @staticmethod
    def valid(session: str) -> str:
        if not SESSION_ID.match(session):
            raise ApiError(400, "session ids are 1-128 characters of letters, digits and ._:@/+=-",
                           "invalid_session", "X-Evoke-Session")
        return session

    def get(self, session: str) -> str | None:
        with self._lock:
            return self._map.get(session)

    def set(self, session: str, conversation_id: str) -> None:
        with self._lock:
            self._map[session] = conversation_id
            self._save()

    def save(self) -> None:
        with self._lock:
            self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"sessions": self._map, "raw_text": self.raw_map.dump()}))
            os.replace(tmp, self.path)
        except OSError:
            pass                      # a cache of routing hints: losing it costs a fork, never data
