"""Conversations as files a person keeps or moves: Markdown to read (and import back), JSON for programs.

Invariants: export reads only the live history (plain rows in, text out); `parse_conversation` reads back
whatever `to_json` or `to_markdown` wrote (and raises ImportFormatError with the reason for anything else),
the messages' text, attachments, extra fields and timestamps unchanged. The Markdown carries what a reader
does not need to see (exact timestamps, a reply's open code fence that the export closed) in one HTML comment
per message, which Markdown viewers hide; a Markdown file without them (hand-written, or from an older
version) imports by its `## User` / `## Assistant` headings, timed at the import.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import ImportFormatError
from ..store.history import ConversationRow, HistoryDB, MessageRow

FORMAT_NAME = "evoke-desk.conversation"
FORMAT_VERSION = 1
ROLES = ("user", "assistant", "tool")
SUFFIXES = {"markdown": ".md", "json": ".json"}

_CONVERSATION_MARK = "<!-- evoke-desk:conversation "
_MESSAGE_MARK = re.compile(r"^<!-- evoke-desk:message (\{.*\}) -->$")
_HEADING = re.compile(r"^## (User|Assistant|Tool)\b(?:\s*·\s*(.*))?$")
_ATTACHED = re.compile(r"^\*\*Attached:\*\* `(.*)`$")
_STAMP_FORMAT = "%Y-%m-%d %H:%M:%S %z"


@dataclass(frozen=True)
class ImportedMessage:
    role: str
    text: str
    attachments: list[tuple[str, str]]
    extra: dict[str, Any]
    created_at: float | None = None          # None: timed at the import


@dataclass(frozen=True)
class ImportedConversation:
    title: str
    system_prompt: str
    tools: list[dict]
    messages: list[ImportedMessage]
    created_at: float | None = None


# -- export ---------------------------------------------------------------------------------------
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


def _comment_json(value: dict[str, Any]) -> str:
    """JSON that cannot end an HTML comment early (every '>' escaped; still valid JSON)."""
    return json.dumps(value, ensure_ascii=False).replace(">", "\\u003e")


def stamp_text(ts: float) -> str:
    """A timestamp as a reader sees it in the export's headings (local time with its UTC offset)."""
    return datetime.fromtimestamp(ts).astimezone().strftime(_STAMP_FORMAT)


def _fence_for(body: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    return "`" * max(3, longest + 1)


def to_markdown(conversation: ConversationRow, messages: list[MessageRow]) -> str:
    settings = conversation.settings if isinstance(conversation.settings, dict) else {}
    head = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "created_at": conversation.created_at,
            **({"tools": settings["tools"]} if settings.get("tools") else {})}
    lines = [f"# {conversation.title}", "", _CONVERSATION_MARK + _comment_json(head) + " -->", ""]
    if conversation.system_prompt:
        lines += ["> **System:** " + conversation.system_prompt.replace("\n", "\n> "), ""]
    for message in messages:
        written = close_open_fences(message.text)
        mark: dict[str, Any] = {"role": message.role, "created_at": message.created_at}
        if written != message.text:
            mark["closed_fence"] = written[len(message.text.rstrip()):].strip()
        if trailing := message.text[len(message.text.rstrip()):]:
            mark["trailing"] = trailing
        if message.attachments:
            mark["attachment_ends"] = [len(body) - len(body.rstrip("\n")) for _, body in message.attachments]
        if message.extra:
            mark["extra"] = message.extra
        lines += [f"<!-- evoke-desk:message {_comment_json(mark)} -->",
                  f"## {message.role.capitalize()} · {stamp_text(message.created_at)}", ""]
        for name, body in message.attachments:
            fence = _fence_for(body)
            lines += [f"**Attached:** `{name}`", "", fence, body.rstrip("\n"), fence, ""]
        lines += [written.rstrip(), ""]
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


def export_file_name(title: str, created_at: float, taken: set[str], suffix: str = ".md") -> str:
    """A file name for one conversation of an "export all": its date and title, unique within `taken` (added)."""
    stem = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in title).strip()[:80] or "conversation"
    stem = f"{time.strftime('%Y-%m-%d', time.localtime(created_at))} {stem}"
    name, n = stem + suffix, 2
    while name.casefold() in taken:
        name, n = f"{stem} ({n}){suffix}", n + 1
    taken.add(name.casefold())
    return name


def write_all(history: HistoryDB, folder: Path, format: str = "markdown") -> list[Path]:
    """Every conversation that has messages into `folder` (made if missing), one file each, named by
    `export_file_name`; files already there keep their names. Returns the paths written, newest first."""
    if format not in SUFFIXES:
        raise ValueError(f"unknown export format {format!r} (markdown or json)")
    folder.mkdir(parents=True, exist_ok=True)
    taken = {p.name.casefold() for p in folder.iterdir()}
    written = []
    for row in history.list_conversations():
        if not (messages := history.messages(row.id)):
            continue
        text = to_markdown(row, messages) if format == "markdown" else to_json(row, messages)
        path = folder / export_file_name(row.title, row.created_at, taken, SUFFIXES[format])
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


# -- import ---------------------------------------------------------------------------------------
def _stamp(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ImportFormatError(f"{where}: created_at must be a timestamp (seconds), not {value!r}")
    return float(value)


def parse_conversation(data: str | bytes | dict) -> ImportedConversation:
    """A conversation from a file `to_json` or `to_markdown` wrote (JSON when it opens with '{')."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ImportFormatError(f"not a UTF-8 text file: {exc}") from exc
    if isinstance(data, dict) or data.lstrip("\ufeff \t\r\n").startswith("{"):
        return parse_json(data)
    return parse_markdown(data)


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
                                        extra, _stamp(raw.get("created_at"), f"message {i}")))
    return ImportedConversation(title or "Imported", system_prompt, tools, messages,
                                _stamp(head.get("created_at"), "the conversation"))


def _mark_of(line: str, where: str) -> dict[str, Any]:
    try:
        mark = json.loads(line)
    except ValueError as exc:
        raise ImportFormatError(f"{where}: a damaged evoke-desk comment ({exc})") from exc
    if not isinstance(mark, dict):
        raise ImportFormatError(f"{where}: a damaged evoke-desk comment")
    return mark


def _message_starts(lines: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """Where each message begins and what its comment says: at the evoke-desk comments when the file has
    them, else at each `## User|Assistant|Tool` heading outside a code fence."""
    marked = [(i, _mark_of(m.group(1), f"line {i + 1}")) for i, line in enumerate(lines)
              if (m := _MESSAGE_MARK.match(line))]
    if marked:
        return marked
    starts, fence = [], ""
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        run = stripped[:len(stripped) - len(stripped.lstrip("`~"))]
        if len(run) >= 3 and len(set(run)) == 1:
            if not fence:
                fence = run
            elif run[0] == fence[0] and len(run) >= len(fence) and not stripped[len(run):].strip():
                fence = ""
        elif not fence and (heading := _HEADING.match(line)):
            starts.append((i, {"role": heading.group(1).lower(), "created_at": _heading_stamp(heading.group(2))}))
    return starts


def _heading_stamp(text: str | None) -> float | None:
    try:
        return datetime.strptime(text.strip(), _STAMP_FORMAT).timestamp() if text else None
    except ValueError:
        return None


def _read_attachments(lines: list[str], at: int) -> tuple[list[tuple[str, str]], int]:
    """The `**Attached:**` blocks starting at line `at`, and the line after them."""
    attachments = []
    while at < len(lines) and (attached := _ATTACHED.match(lines[at])):
        opening = at + 1
        while opening < len(lines) and not lines[opening].strip():
            opening += 1
        fence = lines[opening].strip() if opening < len(lines) else ""
        if len(fence) < 3 or set(fence) - {"`", "~"} or len(set(fence)) != 1:
            raise ImportFormatError(f"line {at + 1}: the attached file {attached.group(1)!r} has no code fence")
        end = opening + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        attachments.append((attached.group(1), "\n".join(lines[opening + 1:end])))
        at = end + 1
        if at < len(lines) and not lines[at].strip():
            at += 1
    return attachments, at


def _message(lines: list[str], start: int, end: int, mark: dict[str, Any]) -> ImportedMessage:
    where = f"the message at line {start + 1}"
    role = mark.get("role")
    if role not in ROLES:
        raise ImportFormatError(f"{where} needs a role ({', '.join(ROLES)})")
    at = start + 1 if _MESSAGE_MARK.match(lines[start]) else start
    if at < end and _HEADING.match(lines[at]):
        at += 1
    if at < end and not lines[at].strip():
        at += 1
    attachments, at = _read_attachments(lines[:end], at)
    ends = mark.get("attachment_ends", [])
    if isinstance(ends, list) and len(ends) == len(attachments) and all(isinstance(n, int) for n in ends):
        attachments = [(name, body + "\n" * n) for (name, body), n in zip(attachments, ends, strict=True)]
    text = "\n".join(lines[at:end]).rstrip()
    closed = mark.get("closed_fence")
    if isinstance(closed, str) and closed and text.endswith(closed):
        text = text[:-len(closed)].rstrip()
    trailing = mark.get("trailing", "")
    text += trailing if isinstance(trailing, str) and not trailing.strip() else ""
    extra = mark.get("extra", {})
    if not isinstance(extra, dict):
        raise ImportFormatError(f"{where}: extra must be an object")
    return ImportedMessage(role, text, attachments, extra, _stamp(mark.get("created_at"), where))


def parse_markdown(text: str) -> ImportedConversation:
    """A conversation from `to_markdown`'s output, or any Markdown with `## User` / `## Assistant` sections."""
    lines = text.lstrip("\ufeff").replace("\r\n", "\n").split("\n")
    starts = _message_starts(lines)
    if not starts and not any(line.startswith(_CONVERSATION_MARK) for line in lines):
        raise ImportFormatError("not an Evoke Desk conversation: no \"## User\" or \"## Assistant\" section")
    title, head = "Imported", {}
    system: list[str] = []
    for line in lines[:starts[0][0] if starts else len(lines)]:
        if line.startswith("# ") and title == "Imported":
            title = line[2:].strip() or title
        elif line.startswith(_CONVERSATION_MARK) and line.endswith(" -->"):
            head = _mark_of(line[len(_CONVERSATION_MARK):-4], "the evoke-desk conversation comment")
        elif line.startswith("> **System:** ") and not system:
            system.append(line[len("> **System:** "):])
        elif system and line.startswith(">"):
            system.append(line[2:] if line.startswith("> ") else line[1:])
    tools = head.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ImportFormatError("tools must be a list of tool schemas")
    bounds = [s for s, _ in starts[1:]] + [len(lines)]
    messages = [_message(lines, start, end, mark) for (start, mark), end in zip(starts, bounds, strict=True)]
    return ImportedConversation(title, "\n".join(system), tools, messages,
                                _stamp(head.get("created_at"), "the conversation"))


def store_imported(history: HistoryDB, conversation_id: str, imported: ImportedConversation,
                   settings: dict[str, Any], now: float | None = None) -> None:
    """Write an imported conversation as one transaction, each message with its own time (the import's time
    where the file has none); the conversation counts as used now, so it is listed first."""
    now = time.time() if now is None else now
    created = next((s for s in (imported.created_at, *(m.created_at for m in imported.messages)) if s is not None),
                   now)
    with history.transaction():
        history.create_conversation(conversation_id, imported.title, imported.system_prompt,
                                    settings=settings, now=created)
        for m in imported.messages:
            history.add_message(conversation_id, m.role, m.text, m.attachments,
                                now=now if m.created_at is None else m.created_at, extra=m.extra)
        history.touch(conversation_id, now)
