"""The GGUF's own chat template, rendered in Jinja's sandbox, and per-message text boundaries.

Invariant: the text of message k is render(messages[:k+1]) minus render(messages[:k]), so
the concatenation of all message segments is exactly what the template renders; when a
template does not render prefix-stably, the longest common prefix is used and it is logged.
Keys starting with `evoke_` (the engine's bookkeeping, e.g. `evoke_turn`) never reach the template.
A template that renders each message from the message alone (`local`: checked once, on probe conversations, against
whole renders) renders a segment or a frame after the history's head and its last few messages only (`window`), so
a turn's renders cost the same at message 10 and at message 400; any other template renders the whole history.
A template whose render of a history is not a prefix of its render with one more message (`stable` false, checked
once on probes: Qwen3 drops an older reply's thinking, Mistral moves the system prompt to the last user message, Phi-3
ends a render with its EOS) cuts each message's text out of the whole render it is part of (`_end_of`): the text of the
history in `render(history + later)`, so `segment` and `settled_segments` agree with the whole render, never a diff of
two renders that disagree; what the KV decoded before such a change is re-decoded by `conversations/rerender.py`.
`strftime_now` gives the date the template was loaded on, so one load renders the same text all day and night.
A template that refuses a system message (Gemma 2) gets it at the head of the first user message, as llama.cpp does.
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
# Conversations `ChatTemplate.stable` renders message by message (roles, then contents): plain turns, replies that
# carry a reasoning block, tool results one after another. A probe the template refuses is skipped.
_STABLE_PROBES = (("user", "assistant", "user", "assistant", "user"),
                  ("user", "assistant", "tool", "tool", "assistant", "user"))
_THINKING_REPLY = "<think>\nweigh the options\n</think>\n\nthe answer"


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
        loaded_on = datetime.datetime.now()
        env.globals["strftime_now"] = loaded_on.strftime              # the load's date: renders do not drift
        self._template = env.from_string(self.source)
        self._bos, self._eos = bos_token, eos_token
        self._local: bool | None = None
        self._stable: bool | None = None
        self._system_in_user = self._refuses_system()

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False,
               tools: list[dict] | None = None) -> str:
        messages = [{k: v for k, v in m.items() if not k.startswith("evoke_")} for m in messages]
        if self._system_in_user and messages and messages[0].get("role") == "system":
            messages = _system_into_first_user(messages)
            if not messages:                    # a system message alone: its text waits for the first user message
                return self._bos if self.source.lstrip().startswith("{{ bos_token }}") else ""
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     tools=tools or None, bos_token=self._bos, eos_token=self._eos)

    def _refuses_system(self) -> bool:
        """Whether the template raises on a system message it renders fine without (Gemma 2)."""
        user = {"role": "user", "content": "probe"}
        try:
            self._template.render(messages=[user], add_generation_prompt=True, bos_token=self._bos,
                                  eos_token=self._eos)
        except Exception:  # noqa: BLE001 - a template that refuses even this is not ours to fix
            return False
        try:
            self._template.render(messages=[{"role": "system", "content": "probe"}, user],
                                  add_generation_prompt=True, bos_token=self._bos, eos_token=self._eos)
        except TemplateError:
            log.info("chat template refuses a system message: it goes at the head of the first user message")
            return True
        except Exception:  # noqa: BLE001
            return False
        return False

    @property
    def stable(self) -> bool:
        """Whether the render of every history is a prefix of its render with one more message (checked once, on
        probe conversations: plain turns, replies carrying a reasoning block, tool results one after another).
        A template that is not rewrites earlier messages when later ones arrive: see `_end_of`."""
        if self._stable is None:
            self._stable = self._renders_stably()
            if not self._stable:
                log.info("chat template rewrites earlier messages when later ones arrive: each message is cut out "
                         "of the whole render, and what changed is decoded again")
        return self._stable

    def _renders_stably(self) -> bool:
        for thinking in (False, True):
            for roles in _STABLE_PROBES:
                for head in ([{"role": "system", "content": "probe system"}], []):
                    history = list(head)
                    try:
                        for i, role in enumerate(roles):
                            content = _THINKING_REPLY if thinking and role == "assistant" else f"{role} {i}"
                            message = {"role": role, "content": content}
                            if role == "tool":
                                message["tool_call_id"] = f"call{i:05d}"[:9].ljust(9, "0")
                            if history and not self.render([*history, message]).startswith(self.render(history)):
                                return False
                            history.append(message)
                    except TemplateError:
                        continue                        # a shape this template does not take: not a rewrite
        return True

    @property
    def rendering(self) -> str:
        """What each turn renders, in words (the model info's line)."""
        if not self.stable:
            return "the whole history, cut message by message (this template rewrites earlier messages)"
        return "its last messages" if self.local else "the whole history"

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
        if not self.stable:
            return self._cut_segment(history, message)
        before = self.render(history) if history else ""
        after = self.render([*history, message])
        return _diff(before, after)

    def _cut_segment(self, history: Sequence[dict[str, Any]], message: dict[str, Any]) -> str:
        """`message`'s text in the render a turn after `history` decodes (with the generation prompt where the
        template gives one after it): from where the history's text ends in it to where the message's ends."""
        messages = [*history, message]
        whole, prompted = self._whole(messages)
        return whole[self._end_of(list(history), [message], whole, prompted):
                     self._end_of(messages, [], whole, prompted)]

    def _whole(self, messages: Sequence[dict[str, Any]]) -> tuple[str, bool]:
        """The render of `messages` with the generation prompt (False: the template refuses one after them)."""
        try:
            return self.render(messages, add_generation_prompt=True), True
        except TemplateError:
            return self.render(messages), False

    def _end_of(self, history: list[dict[str, Any]], later: list[dict[str, Any]], whole: str,
                prompted: bool) -> int:
        """Where `history`'s text ends in `whole` (the render of `history + later`): where the render of
        `history` alone stops agreeing with it, or, when that is inside the last message's own text (the template
        rewrites it once a message follows), after that message's content as `whole` renders it and as much of
        the markup the message ends with when it is last as `whole` holds there."""
        if not history:
            return 0
        alone = self.render(history)
        agreed = _common_prefix(alone, whole)
        content = history[-1].get("content")
        if agreed == len(alone) or not isinstance(content, str) or not content:
            return agreed
        marked = {**history[-1], "content": _CONTENT}
        try:
            marked_whole = self.render([*history[:-1], marked, *later], add_generation_prompt=prompted)
            marked_alone = self.render([*history[:-1], marked])
        except TemplateError:
            return agreed
        at, own = marked_whole.find(_CONTENT), marked_alone.find(_CONTENT)
        if at < 0 or own < 0 or marked_whole[:at] != whole[:at]:
            return agreed
        after = marked_whole[at + len(_CONTENT):]
        end = len(whole) - len(after)
        if not whole.endswith(after) or end < at:
            return agreed
        closing = marked_alone[own + len(_CONTENT):]
        return max(agreed, end + _common_prefix(whole[end:], closing))

    def settled_segments(self, messages: Sequence[dict[str, Any]], start: int = 0) -> list[Segment]:
        """The segments of `messages[start:-1]` as a turn after all of them renders them (the last message is
        the turn's input: its own segment is `message_segment`), content located as `message_segment` does. For a
        `stable` template each is the segment it got when it was new."""
        messages = list(messages)
        if self.stable:
            return [self.message_segment(messages[:k], messages[k]) for k in range(start, len(messages) - 1)]
        if self.local:                          # each cut from its own window: a few messages either side
            return [self._settled_in_window(messages, k) for k in range(start, len(messages) - 1)]
        whole, prompted = self._whole(messages)
        ends = [self._end_of(messages[:k + 1], messages[k + 1:], whole, prompted)
                for k in range(max(start - 1, 0), len(messages) - 1)]
        if start == 0:
            ends.insert(0, 0)
        return [self._cut(whole, begin, max(begin, end), messages, start + k, prompted)
                for k, (begin, end) in enumerate(zip(ends, ends[1:], strict=False))]

    def _settled_in_window(self, messages: list[dict[str, Any]], k: int) -> Segment:
        """`settled_segments`' segment of message `k` of a `local` template, cut from the render of its window
        (`window(messages[:k])`), itself and up to `WINDOW_MESSAGES` messages after it."""
        before = list(self.window(messages[:k]))
        later = messages[k + 1:k + 1 + WINDOW_MESSAGES]
        sub = [*before, messages[k], *later]
        if k + 1 + WINDOW_MESSAGES >= len(messages):
            whole, prompted = self._whole(sub)
        else:
            whole, prompted = self.render(sub), False
        begin = self._end_of(before, [messages[k], *later], whole, prompted)
        end = max(begin, self._end_of([*before, messages[k]], later, whole, prompted))
        return self._cut(whole, begin, end, sub, len(before), prompted)

    def _cut(self, whole: str, begin: int, end: int, messages: list[dict[str, Any]], k: int,
             prompted: bool) -> Segment:
        """`whole[begin:end]` as message `k`'s segment, its content where the render with a placeholder for it
        puts the placeholder (the content as the template rewrote it, e.g. a reply without its thinking)."""
        content = messages[k].get("content")
        if isinstance(content, str) and content:
            try:
                marked = self.render([*messages[:k], {**messages[k], "content": _CONTENT}, *messages[k + 1:]],
                                     add_generation_prompt=prompted)
            except TemplateError:
                marked = ""
            at = marked.find(_CONTENT)
            after = marked[at + len(_CONTENT):]
            c0, c1 = at, len(whole) - len(after)
            if at >= 0 and whole.startswith(marked[:at]) and whole.endswith(after) and begin <= c0 <= c1 <= end:
                return Segment(whole[begin:end], ((c0 - begin, c1 - begin),) if c1 > c0 else ())
        return _located(whole[begin:end], content)

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
        opening = (_diff(plain, prompted) if self.stable     # else after the history as the prompted render cuts it
                   else prompted[self._end_of(list(history), [], prompted, True):])
        reply = {"role": "assistant", "content": _SENTINEL}
        full = self.render([*history, reply])
        tail = full[len(plain):] if full.startswith(plain) else full
        at = tail.find(_SENTINEL)
        closing = tail[at + len(_SENTINEL):] if at >= 0 else ""
        if not self.stable and closing:         # only what stays once a message follows (not Phi-3's EOS)
            try:
                followed = self.render([*history, reply, {"role": "user", "content": _PROBE}])
                closing = closing[:_common_prefix(closing, followed[followed.find(_SENTINEL) + len(_SENTINEL):])]
            except TemplateError:
                pass
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


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n                                # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def _located(text: str, content: Any) -> Segment:
    """`text` with `content` located in it (its last occurrence, stripped: a template that trims or rewrites a
    message keeps its tail); all markup when it is not there."""
    core = content.strip() if isinstance(content, str) else ""
    at = text.rfind(core) if core else -1
    return Segment(text, ((at, at + len(core)),)) if at >= 0 else Segment(text)


def _system_into_first_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A system message the template refuses, put at the head of the first user message (llama.cpp's way)."""
    system, rest = messages[0], list(messages[1:])
    for i, message in enumerate(rest):
        if message.get("role") == "user":
            rest[i] = {**message, "content": f"{system.get('content') or ''}\n\n{message.get('content') or ''}"}
            break
    return rest


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
