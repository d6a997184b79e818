"""Requests as canonical messages, how they line up with a conversation, and the session table.

Invariants: a request and a conversation are compared as (role, content) with content exactly what the
engine puts in its template history, so agreement means the cached KV is the request's prefix; a plan
continues a conversation only when the request extends all of it, and otherwise forks at the last
agreeing reply (never reuses a cache that disagrees). Session ids are JSON keys, never file names, and
live in their owner's namespace: the same name from two clients names two sessions. One owner keeps at most
`max_per_owner` named sessions (past it its own least recently used name is forgotten, its conversation handed to
`on_forget`), and one owner's sessions never evict another's: past `max_sessions` in all a new name is refused
(`room_for`), never made by forgetting someone else's.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import render_user_content
from .api_errors import ApiError
from .request_bodies import ChatMessage, ChatRequest
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
        elif part.type == "file":
            if part.file is None:
                raise ApiError(400, f"content part {i} of type 'file' needs a 'file' object "
                                    "({\"filename\": ..., \"file_data\": ...})", "invalid_file", "messages")
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
    """(owner, session name) -> conversation id, and which client owns each API conversation, kept in one
    JSON file (atomic replace, 0600). Names are looked up only within their owner's namespace; entries of a
    conversation that no longer exists are dropped (`prune`); an owner past `max_per_owner` forgets its own least
    recently used names; past `max_sessions` in all no new name is made (`room_for` says so beforehand)."""

    MAX_SESSIONS = 10_000
    MAX_PER_OWNER = 256

    def __init__(self, path: Path, raw_map: RawTextMap, clock=time.time) -> None:
        self.path = path
        self.raw_map = raw_map
        self.clock = clock
        self.max_sessions = self.MAX_SESSIONS
        self.max_per_owner = self.MAX_PER_OWNER
        self.on_forget = None                    # called with the conversation ids whose names were forgotten
        self._owner_set: frozenset[str] = frozenset()      # every owner on record: read without the lock
        self._lock = threading.Lock()
        self._map: dict[str, dict] = {}          # "owner\x1fname" -> {"conversation": id, "used": unix time}
        self._owners: dict[str, str] = {}        # API conversation id -> owner
        try:
            data = json.loads(path.read_text())
            for key, entry in data.get("sessions", {}).items():
                if "\x1f" in key and isinstance(entry, dict) and isinstance(entry.get("conversation"), str):
                    self._map[key] = {"conversation": entry["conversation"], "used": float(entry.get("used", 0))}
            self._owners = {str(k): str(v) for k, v in data.get("owners", {}).items()}
            raw_map.load(data.get("raw_text", {}))
        except (OSError, ValueError, AttributeError, TypeError):
            pass                     # unnamed-owner entries of older files are dropped: names alone granted them
        self._refresh_owners()

    @staticmethod
    def valid(session: str) -> str:
        if not SESSION_ID.match(session):
            raise ApiError(400, "session ids are 1-128 characters of letters, digits and ._:@/+=-",
                           "invalid_session", "X-Evoke-Session")
        return session

    @staticmethod
    def _key(owner: str, session: str) -> str:
        return f"{owner}\x1f{session}"

    def get(self, owner: str, session: str) -> str | None:
        with self._lock:
            entry = self._map.get(self._key(owner, session))
            return entry["conversation"] if entry else None

    def owner_of(self, conversation_id: str) -> str | None:
        with self._lock:
            return self._owners.get(conversation_id)

    def has_owner(self, owner: str) -> bool:
        """`owner` holds an API conversation or a session here (lock-free: the event loop asks on every request)."""
        return owner in self._owner_set

    def sessions_of(self, owner: str) -> int:
        with self._lock:
            return len(self._keys_of(owner))

    def room_for(self, owner: str, session: str) -> bool:
        """`owner` may name `session` now: it names it already, or the map is under `max_sessions` in all, or the
        owner has names of its own to forget for it."""
        with self._lock:
            key = self._key(owner, session)
            return key in self._map or len(self._map) < self.max_sessions or bool(self._keys_of(owner))

    def _keys_of(self, owner: str) -> list[str]:
        prefix = owner + "\x1f"
        return [key for key in self._map if key.startswith(prefix)]

    def set(self, owner: str, session: str | None, conversation_id: str) -> None:
        """Record that `owner` holds `conversation_id` (under `session`, if named); past the caps, the owner's own
        least recently used names are forgotten (never another owner's)."""
        forgotten: list[str] = []
        with self._lock:
            self._owners.setdefault(conversation_id, owner)
            if session is not None:
                key = self._key(owner, session)
                self._map[key] = {"conversation": conversation_id, "used": self.clock()}
                forgotten = self._forget_past_caps(owner, key)
            self._refresh_owners()
            self._save()
        if forgotten and self.on_forget is not None:
            self.on_forget(forgotten)

    def _forget_past_caps(self, owner: str, keep: str) -> list[str]:
        """Forget `owner`'s least recently used names (not `keep`) past `max_per_owner`, and past `max_sessions`
        in all as far as its own names go; the conversation ids no name holds any more."""
        own = sorted((k for k in self._keys_of(owner) if k != keep), key=lambda k: self._map[k]["used"])
        over = max(len(own) + 1 - self.max_per_owner, len(self._map) - self.max_sessions, 0)
        gone = [self._map.pop(key)["conversation"] for key in own[:over]]
        named = {entry["conversation"] for entry in self._map.values()}
        return [cid for cid in gone if cid not in named]

    def _refresh_owners(self) -> None:
        self._owner_set = frozenset(self._owners.values()) | {key.split("\x1f", 1)[0] for key in self._map}

    def prune(self, exists) -> int:
        """Drop the sessions and owners of conversations for which `exists(id)` is false; how many went."""
        with self._lock:
            ids = {e["conversation"] for e in self._map.values()} | set(self._owners)
            gone = {i for i in ids if not exists(i)}
            if not gone:
                return 0
            before = len(self._map) + len(self._owners)
            self._map = {k: e for k, e in self._map.items() if e["conversation"] not in gone}
            self._owners = {c: o for c, o in self._owners.items() if c not in gone}
            self._refresh_owners()
            self._save()
            return before - len(self._map) - len(self._owners)

    def __len__(self) -> int:
        with self._lock:
            return len(self._map)

    def save(self) -> None:
        with self._lock:
            self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            text = json.dumps({"sessions": self._map, "owners": self._owners, "raw_text": self.raw_map.dump()})
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(tmp, self.path)
        except OSError:
            pass                      # a cache of routing hints: losing it costs a fork, never data
