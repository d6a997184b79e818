"""Which lines of coding-day text hold a value, and the dense rule that lets only those set a block's line score when
the message asks for a value (`recall_value_lines`, issue 46).

A question that asks for a value ("how many workers did the backup use?") is answered by a line that holds one: a
number, a quoted literal, a `key: value` or `NAME = value`, a command line's flag with its argument, a table row, a
decision stated in chat. A docstring, prose without a value, an import, a bare `def` or `class` line or a comment
may be close to the question's topic but cannot answer it; with the rule, such a line no longer sets its block's
dense score over a block whose value line matches a little less well.

Invariants: `holds_value` reads one line (as `recall_signals.block_lines` gives it: short lines may be joined to the
next) and knows nothing of the workload; `value_line_scores` only changes which lines' similarities count, never
what is embedded (the line vectors and their cache keys are the same with the rule on or off).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

# a number: a digit that does not sit inside a word (`30`, `3.11`, `0x1f`, `[Errno 24]`; not `sha256`, `boto3`, `v2`)
_NUMBER = re.compile(r"(?<!\w)\d")
# a quoted literal: '...' or "..." not glued to a word (an apostrophe in `don't ... it's` is none)
_QUOTED = re.compile(r"""(?<![\w'"])(?:"[^"\n]+"|'[^'\n]+')(?![\w'"])""")
_DOCSTRING = re.compile(r"""^\s*[rRbBuU]?("{3}|'{3})""")
# key: scalar, key = scalar, NAME=scalar; the scalar ends the line (a comment allowed) or another key follows it
# (short YAML lines are joined: `enabled: true log_level: info`)
_SCALAR = r"[\w./@%+~-][\w./:@%+~-]*"
_NEXT = r"(?=\s*(?:#.*)?$|\s+[A-Za-z_][\w.-]*\s*[:=]\s)"
_COLON_PAIR = re.compile(rf"(?:^|\s)[A-Za-z_][\w.-]*:\s+(?P<value>{_SCALAR}){_NEXT}")
_SPACED_ASSIGN = re.compile(rf"(?:^|\s)[A-Za-z_][\w.-]*\s+=\s+(?P<value>{_SCALAR}){_NEXT}")
_TIGHT_ASSIGN = re.compile(rf"(?:^|\s)[A-Za-z_][\w.-]*=(?P<value>{_SCALAR}){_NEXT}")
# `x = y` in code binds a name (not a value) unless the right side is a literal word; a `name: str` field is a type
# and `except KeyError: pass` a statement, not a value
_LITERAL_WORDS = frozenset({"true", "false", "none", "null", "nil", "yes", "no", "on", "off"})
_NOT_VALUES = frozenset({"str", "int", "float", "bool", "bytes", "list", "dict", "set", "tuple", "object", "any",
                         "pass", "continue", "break", "return", "raise", "yield"})
# a command-line flag with its argument: `--maxfail 3`, `--mode=fast`, `-n 12` (not `--headless` alone, not `-la`)
_FLAG = re.compile(r"(?:^|\s)(?:--[A-Za-z][\w-]*(?:=|\s+)|-[A-Za-z]\s+)[^\s-]")
_TABLE_ROW = re.compile(r"^\s*\|(?P<cells>.*)\|\s*$")
_RULE_CELL = re.compile(r"^:?-+:?$")
# a decision stated in chat, with an object after it: "let's go with X", "we'll use X", "decided to X", "switch to X"
_DECISION = re.compile(
    r"\b(?:decided|decision|agreed|final call|settled? on|going with|go with|stick(?:ing)? with|opt(?:ed)? for|"
    r"chose|chosen|switch(?:ed|ing)? (?:over )?to|mov(?:e|ed|ing) to|migrat(?:e|ed|ing) to|standardi[sz]ed? on|"
    r"(?:let's|let us|we'll|we will|we're going to|we are going to|we should|we must)\s+(?:just\s+|now\s+|also\s+)?"
    r"(?:use|keep|adopt|pick|choose|drop|cap|limit|set|pin|run|raise|lower))\b\W*\w",
    re.IGNORECASE)


@lru_cache(maxsize=1 << 16)
def holds_value(line: str) -> bool:
    """Whether a line of coding-day text holds a value a question could ask for: a number (a digit not inside a
    word); a quoted literal (not a docstring); an assignment of a scalar (`key: value`, `key = value` with a literal
    word, a number or a string, `NAME=value`); a command-line flag with an argument (`--maxfail 3`, `-n 12`,
    `--mode=fast`); a markdown table row with at least two non-empty cells; a decision stated in chat with an object
    ("let's go with Redis", "we'll use uv", "decided to pin it"). Prose without one (a sentence that only names a
    function, "tokens are checked in verify_token.", included), imports, bare `def`/`class` lines, comments and
    docstrings without a number hold none."""
    if _NUMBER.search(line) or _FLAG.search(line) or _DECISION.search(line):
        return True
    if not _DOCSTRING.match(line) and _QUOTED.search(line):
        return True
    row = _TABLE_ROW.match(line)
    if row:
        cells = [c.strip() for c in row.group("cells").split("|")]
        if sum(1 for c in cells if c and not _RULE_CELL.match(c)) >= 2:
            return True
    if any(m.group("value").lower() not in _NOT_VALUES for m in _COLON_PAIR.finditer(line)):
        return True
    if any(m.group("value").lower() in _LITERAL_WORDS for m in _SPACED_ASSIGN.finditer(line)):
        return True
    return bool(_TIGHT_ASSIGN.search(line))


def value_line_scores(lines_and_sims: dict, dense: dict) -> float:
    """Rescore `dense` in place for a message that asks for a value: a block with a line that `holds_value` scores
    the best similarity among those lines; a block with none keeps its best line's similarity less the median, over
    the blocks that have value lines, of how far their best line stood above their best value line (as if it had a
    value line of the usual standing; a tiny margin at least, so it ranks after a block whose value line matches as
    well). `lines_and_sims`: block -> (its lines, their similarities to the message). Returns that margin."""
    gaps: list[float] = []
    without: list = []
    for block, (lines, sims) in lines_and_sims.items():
        mask = value_mask(lines)
        if mask is not None and mask.any():
            best_value = float(sims[mask].max())
            gaps.append(dense[block] - best_value)
            dense[block] = best_value
        else:
            without.append(block)
    margin = max(float(np.median(gaps)) if gaps else 0.0, 1e-6)
    for block in without:
        dense[block] -= margin
    return margin


def value_mask(lines: Sequence[str]) -> np.ndarray | None:
    """`holds_value` of each line, as a boolean array (None for no lines)."""
    return np.fromiter((holds_value(line) for line in lines), dtype=bool, count=len(lines)) if len(lines) else None
