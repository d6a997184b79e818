"""The chat's text size (the `text_size` setting, in percent): the steps Ctrl+Plus and Ctrl+Minus take, and the
font sizes of the chat's text scaled from those resources/style.qss gives it (bubbles, code, the box, the list).

Pure functions, no Qt. Invariants: a step always lands within the setting's bounds, on the next rung of `RUNGS`
(a value between rungs steps to the nearest one on that side); at 100 % no rule is written, so the window looks
exactly as the style sheet says; only font sizes are written, never a colour (the theme owns those).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# the sizes a step lands on (those browsers and editors offer), in percent; the setting's bounds cut them
RUNGS = (50, 60, 70, 80, 90, 100, 110, 125, 150, 175, 200, 250, 300)
# the widgets whose text is the chat's (object names): the messages and their parts, the message box, the sidebar
TEXT_NAMES = (
    "conversationTitle", "placeholder", "chatNotice", "firstStart",
    "bubbleHeader", "bubbleTime", "bubbleBody", "bubbleFooter", "attachmentLine", "messageAction",
    "versionStep", "versionLabel", "replyEndNote", "continueButton", "codeLanguage", "codeCopy", "codeText",
    "prompt", "chipLabel",
    "search", "newButton", "searchSummary", "searchHit", "conversationList",
)
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_RULE = re.compile(r"([^{}]+)\{([^{}]*)\}")
_FONT_SIZE = re.compile(r"font-size\s*:\s*([0-9.]+)pt")
_BY_NAME = re.compile(r"(?:[A-Za-z]\w*)?#(\w+)")          # "#bubbleBody", "QListView#eventList"
FALLBACK_POINTS = 10.0                                     # when the sheet names no size at all


def step(percent: int, direction: int, low: int, high: int) -> int:
    """The size one step bigger (`direction` > 0) or smaller than `percent`, within [low, high]."""
    rungs = sorted({low, high, *(r for r in RUNGS if low < r < high)})
    if direction > 0:
        return min((r for r in rungs if r > percent), default=high)
    return max((r for r in rungs if r < percent), default=low)


def base_points(sheet: str, names: Iterable[str] = TEXT_NAMES) -> dict[str, float]:
    """The font size (pt) the style sheet gives each named widget: its own rule's (`#name` or `Class#name`, the
    last one that sets a size), else the sheet's `QWidget` size."""
    found: dict[str, float] = {}
    general = FALLBACK_POINTS
    for selectors, body in _RULE.findall(_COMMENT.sub("", sheet)):
        size = _FONT_SIZE.search(body)
        if size is None:
            continue
        for selector in (s.strip() for s in selectors.split(",")):
            if selector == "QWidget":
                general = float(size.group(1))
            elif match := _BY_NAME.fullmatch(selector):
                found[match.group(1)] = float(size.group(1))
    return {name: found.get(name, general) for name in names}


def scaled_points(points: float, percent: int) -> float:
    return round(points * percent / 100, 2)


def text_size_sheet(bases: dict[str, float], percent: int) -> str:
    """The window's style sheet for `percent`: one font-size rule per named widget ("" at 100 %)."""
    if percent == 100:
        return ""
    return "\n".join(f"#{name} {{ font-size: {scaled_points(points, percent):g}pt; }}"
                     for name, points in bases.items())
