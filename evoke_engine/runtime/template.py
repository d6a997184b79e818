"""The GGUF's own chat template, rendered in Jinja's sandbox, and per-message text boundaries.

Invariant: the text of message k is render(messages[:k+1]) minus render(messages[:k]), so
the concatenation of all message segments is exactly what the template renders; when a
template does not render prefix-stably, the longest common prefix is used and it is logged.
Keys starting with `evoke_` (the engine's bookkeeping, e.g. `evoke_turn`) never reach the template.
A template that renders each message from the message alone (`local`: checked once, on probe conversations, against
whole renders) renders a segment or a frame after the history's head and its last few messages only (`window`), so
a turn's renders cost the same at message 10 and at message 400; any other template renders the whole history.
A `Segment` marks which characters are the message's own content: only the template's markup around
it may become special tokens (`<|im_start|>` typed by a user or found in a file stays text).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger(__name__)

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
_SENTINEL = "\x00EVOKE-REPLY\x00"
_PROBE = "\x00evoke-next-message\x00"
_CONTENT = "\x00evoke-message-content\x00"
WINDOW_MESSAGES = 4          # at least the messages a segment renders after, from a user message on (`window`)
# Probe conversations `ChatTemplate.local` renders whole and windowed: contents of several shapes, a system message
# or none, a reply between each two user messages.
_LOCAL_PROBES = ("short", "two\nlines", "  padded  ", "a longer message with `code` and {braces} in it", "ünïcödé", "")


def _raise(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True)
class AssistantFrame:
    opening: str      # generation prompt, e.g. "<|im_start|>assistant\n"
    closing: str      # what follows the reply's text, e.g. "<|im_end|>\n"


@dataclass(frozen=True)
class Segment:
    """The text the template adds for one message, and the character ranges of the message's content in it."""

    text: str
    content: tuple[tuple[int, int], ...] = ()    # sorted, disjoint [start, end) ranges: never special tokens

    def parts(self, start: int = 0, end: int | None = None) -> list[tuple[str, bool]]:
        """(text, special) pieces of `text[start:end]`, in order: markup is special, content is not."""
        end = len(self.text) if end is None else end
        parts: list[tuple[str, bool]] = []
        cursor = start
        for c0, c1 in self.content:
            c0, c1 = max(c0, start), min(c1, end)
            if c0 >= c1:
                continue
            if cursor < c0:
                parts.append((self.text[cursor:c0], True))
            parts.append((self.text[c0:c1], False))
            cursor = c1
        if cursor < end:
            parts.append((self.text[cursor:end], True))
        return parts


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        self._template = env.from_string(self.source)
        self._bos, self._eos = bos_token, eos_token
        self._local: bool | None = None

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False,
               tools: list[dict] | None = None) -> str:
        messages = [{k: v for k, v in m.items() if not k.startswith("evoke_")} for m in messages]
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     tools=tools or None, bos_token=self._bos, eos_token=self._eos)

    @property
    def local(self) -> bool:
        """Whether this template renders a message's segment and the reply's frame alike after a whole history and
        after its `window` (checked once, on probe conversations with and without a system message: a template that
        numbers messages, counts turns or looks back at earlier ones is not local, nor one that refuses a probe)."""
        if self._local is None:
            self._local = self._renders_locally()
            if not self._local:
                log.info("chat template renders messages from their history: every turn renders it whole")
        return self._local

    def _renders_locally(self) -> bool:
        try:
            for head in ([{"role": "system", "content": "probe system"}], []):
                history = list(head)
                for i, text in enumerate(_LOCAL_PROBES * 2):
                    for message in ({"role": "user", "content": f"{text} {i}"},
                                    {"role": "assistant", "content": f"reply {i}: {text}"}):
                        short = self._window(history, always=True)
                        if len(short) < len(history) and (
                                self._segment(history, message) != self._segment(short, message)
                                or self._frame(history) != self._frame(short)):
                            return False
                        history.append(message)
        except Exception:  # noqa: BLE001 - a template that refuses a probe renders whole
            return False
        return True

    def window(self, history: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        """What a segment or frame after `history` is rendered after: for a `local` template, its system message
        (if first) and its messages from the last user message at or before its last `WINDOW_MESSAGES` on (a
        turn's tool calls and results stay together); the whole history otherwise."""
        return self._window(history, always=False)

    def _window(self, history: Sequence[dict[str, Any]], *, always: bool) -> Sequence[dict[str, Any]]:
        head = 1 if history and history[0].get("role") == "system" else 0
        if len(history) - head <= WINDOW_MESSAGES or not (always or self.local):
            return history
        start = len(history) - WINDOW_MESSAGES
        while start > head and history[start].get("role") != "user":
            start -= 1
        if start <= head:
            return history
        return [*history[:head], *history[start:]]

    def segment(self, history: Sequence[dict[str, Any]], message: dict[str, Any]) -> str:
        """The text the template adds for `message` after `history`."""
        return self._segment(self.window(history), message)

    def _segment(self, history: Sequence[dict[str, Any]], message: dict[str, Any]) -> str:
        before = self.render(history) if history else ""
        after = self.render([*history, message])
        return _diff(before, after)

    def message_segment(self, history: Sequence[dict[str, Any]], message: dict[str, Any]) -> Segment:
        """`segment(history, message)` with its content located: rendered once more with a placeholder for
        the content, the content sits where the placeholder does (a template that changes the content, e.g.
        trims it, is searched for the content instead; one that hides it gets all-markup and a warning)."""
        text = self.segment(history, message)
        content = message.get("content")
        if not isinstance(content, str) or not content:
            return Segment(text)
        try:
            probe = self.segment(history, {**message, "content": _CONTENT})
        except Exception:  # noqa: BLE001 - a template that refuses the placeholder is searched instead
            probe = ""
        pieces = probe.split(_CONTENT)
        if len(pieces) > 1 and content.join(pieces) == text:
            ranges, at = [], len(pieces[0])
            for piece in pieces[1:]:
                ranges.append((at, at + len(content)))
                at += len(content) + len(piece)
            return Segment(text, tuple(ranges))
        core = content.strip()
        at = text.find(core) if core else -1
        if at < 0:
            log.warning("chat template does not render a message's content as given; its text may hold "
                        "special tokens")
            return Segment(text)
        return Segment(text, ((at, at + len(core)),))

    def assistant_frame(self, history: Sequence[dict[str, Any]]) -> AssistantFrame:
        """Generation prompt and closing text around an assistant reply after `history`."""
        return self._frame(self.window(history))

    def _frame(self, history: Sequence[dict[str, Any]]) -> AssistantFrame:
        plain = self.render(history)
        prompted = self.render(history, add_generation_prompt=True)
        opening = _diff(plain, prompted)
        full = self.render([*history, {"role": "assistant", "content": _SENTINEL}])
        tail = full[len(plain):] if full.startswith(plain) else full
        at = tail.find(_SENTINEL)
        closing = tail[at + len(_SENTINEL):] if at >= 0 else ""
        return AssistantFrame(opening=opening, closing=closing)

    def user_opening(self, history: Sequence[dict[str, Any]]) -> str:
        """The text the template puts before the content of a user message after `history` (e.g.
        `<|im_start|>user\n`); "" when the template refuses the probe or renders none."""
        try:
            segment = self.segment(history, {"role": "user", "content": _PROBE})
        except Exception:  # noqa: BLE001 - a template that refuses the probe just gets no head start
            return ""
        at = segment.find(_PROBE)
        return segment[:at] if at > 0 else ""


def _diff(before: str, after: str) -> str:
    if after.startswith(before):
        return after[len(before):]
    common = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        common += 1
    log.warning("chat template is not prefix-stable; %d characters re-rendered", len(before) - common)
    return after[common:]
