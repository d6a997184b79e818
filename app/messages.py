"""What the window shows of a conversation: chat messages, the reply being streamed, titles.

Plain data, no Qt: a ChatMessage is what one bubble renders; a Stream is one reply in flight; `end_note` says why a
reply ended short (stopped, cut at max tokens, interrupted by a crash): only such a reply offers Continue generating;
`Versions` are a message's versions as its switch shows them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TITLES = {"New conversation", "Untitled", ""}
EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_name(info: Any) -> str:
    """The one name the window gives a model: its GGUF file's name (not the GGUF's general.name)."""
    path = str(getattr(info, "path", "") or getattr(info, "model_path", "") or "")
    return path.replace("\\", "/").rsplit("/", 1)[-1] if path else str(getattr(info, "name", "") or "?")


def title_from(text: str, attachments: list[tuple[str, int]], limit: int = 48) -> str:
    """A short title: the first line of the message, cut at a word, else the first attachment's name."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        return attachments[0][0] if attachments else ""
    if len(line) > limit:
        line = line[:limit].rsplit(" ", 1)[0].rstrip(",.;:") + "…"
    return line


def reply_meta(n_tokens: int, rate: float, ttft: float, stopped: str, streamed_pieces: int = 0) -> str:
    """The footer of a finished reply; a stopped reply counts the pieces it streamed when the engine
    reports no tokens (never "0 tokens" under text on screen)."""
    n_tokens = n_tokens or streamed_pieces
    parts = [f"{n_tokens} tokens", f"{rate:.1f} tok/s"] if n_tokens else []
    meta = " · ".join(parts + ([f"first token {ttft:.2f} s"] if ttft else []))
    if stopped and stopped not in ("eos", "stop"):
        why = "stopped" if stopped == "cancelled" else stopped.replace("_", " ")
        meta = f"{meta} · {why}" if meta else why
    return meta


# why a reply ended short, as its footer says it next to "Continue generating" (keys: `Reply.stopped`)
SHORT_ENDS = {"cancelled": "Stopped", "max_tokens": "Cut at max tokens", "budget": "Cut: the memory budget was full"}
INTERRUPTED_NOTE = "Interrupted: the app closed before this reply ended"
CONTINUE_LABEL = "Continue generating"


def end_note(message: ChatMessage) -> str:
    """Why a reply ended before it was done ("" for a finished one, a user message or a reply in flight)."""
    if message.role != "assistant":
        return ""
    if message.interrupted:
        return INTERRUPTED_NOTE
    return SHORT_ENDS.get(message.stopped, "")


def stamp_text(ts: float, now: float | None = None) -> str:
    """A message's time in its bubble header, local time: "14:05" today, "3 Mar 14:05" this year, else with the
    year; "" when unknown."""
    if not ts:
        return ""
    when, today = time.localtime(ts), time.localtime(time.time() if now is None else now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M", when)
    day = f"{when.tm_mday} {time.strftime('%b', when)}"
    return f"{day} {time.strftime('%H:%M', when)}" if when.tm_year == today.tm_year else \
        f"{day} {when.tm_year} {time.strftime('%H:%M', when)}"


def stored_meta(row: dict[str, Any]) -> str:
    """The footer of a reply read back from the history: the metrics its row kept (`extra["metrics"]`)."""
    extra = row.get("extra")
    metrics = extra.get("metrics") if isinstance(extra, dict) else None
    if row.get("role") != "assistant" or not isinstance(metrics, dict):
        return ""
    try:
        return reply_meta(int(metrics.get("tokens") or 0), float(metrics.get("tokens_per_s") or 0.0),
                          float(metrics.get("ttft_s") or 0.0), str(metrics.get("stopped") or ""))
    except (TypeError, ValueError):
        return ""


@dataclass
class ChatMessage:
    role: str                                  # user | assistant
    text: str
    attachments: list[tuple[str, int]] = field(default_factory=list)   # (name, characters)
    stopped: str = ""                          # eos | max_tokens | cancelled | ...
    meta: str = ""                             # "42 tokens · 31.0 tok/s · first token 0.21 s"
    index: int = -1                            # its place in the engine's live messages; -1 while unknown
    created_at: float = field(default_factory=time.time)   # when it was written (the bubble header shows it)
    row_id: int = -1                           # its history row (a search hit names it); -1 while unknown
    interrupted: bool = False                  # its row was still being written when the app ended (a crash)

    @classmethod
    def from_history(cls, row: dict[str, Any], index: int = -1) -> ChatMessage:
        atts = [(str(a[0]), len(a[1]) if len(a) > 1 else 0) for a in row.get("attachments") or []]
        metrics = (row.get("extra") or {}).get("metrics") if isinstance(row.get("extra"), dict) else None
        stopped = str(metrics.get("stopped") or "") if isinstance(metrics, dict) else ""
        extra = row.get("extra") if isinstance(row.get("extra"), dict) else {}
        interrupted = bool(row.get("interrupted") or extra.get("interrupted"))
        return cls(row.get("role", "user"), row.get("text", ""), atts, stopped=stopped, meta=stored_meta(row),
                   index=index, created_at=float(row.get("created_at") or 0.0), row_id=int(row.get("id", -1)),
                   interrupted=interrupted)


@dataclass(frozen=True)
class Versions:
    """A message's versions as its "‹ 2/3 ›" switch shows them: texts and history row ids, oldest first, and
    which one is current (the one in the conversation now)."""

    texts: tuple[str, ...]
    ids: tuple[int, ...]
    current: int


@dataclass
class Stream:
    conversation_id: str
    started: float
    text: str = ""
    pieces: int = 0
    first_at: float | None = None
    waited_s: float = 0.0                      # how long its message waited before it was sent
    question: ChatMessage | None = None        # the message it answers (shown until its turn stores it)
