"""What the window shows of a conversation: chat messages, the reply being streamed, titles.

Plain data, no Qt: a ChatMessage is what one bubble renders; a Stream is one reply in flight.
"""

from __future__ import annotations

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


@dataclass
class ChatMessage:
    role: str                                  # user | assistant
    text: str
    attachments: list[tuple[str, int]] = field(default_factory=list)   # (name, characters)
    stopped: str = ""                          # eos | max_tokens | cancelled | ...
    meta: str = ""                             # "42 tokens · 31.0 tok/s · first token 0.21 s"
    index: int = -1                            # its place in the engine's live messages; -1 while unknown

    @classmethod
    def from_history(cls, row: dict[str, Any], index: int = -1) -> ChatMessage:
        atts = [(str(a[0]), len(a[1]) if len(a) > 1 else 0) for a in row.get("attachments") or []]
        return cls(row.get("role", "user"), row.get("text", ""), atts, index=index)


@dataclass
class Stream:
    conversation_id: str
    started: float
    text: str = ""
    pieces: int = 0
    first_at: float | None = None
