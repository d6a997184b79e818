"""The loaded model's glosses of a block's value lines (issue 61): one short plain-language phrase per line saying
what its value means ("how often the status page reloads, in milliseconds"), read by the recall signals beside it.

Invariants: pure logic over plain strings (no llama.cpp: `conversations/gloss_writer.py` runs the model); a block's
glosses are kept in `BOOK` by its content hash, process-wide (the same text has the same glosses in every
conversation, resident or in the pool), and travel in its conversation's KV file (`GlossBook.export` / `seed`); a
block's glosses are put whole, once (a reply cut short puts nothing); `GlossBook.suffix` changes whenever a block's
glosses do, so line vectors embedded without them are never taken for the block with them.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterable

from .value_lines import holds_value

GLOSS_VERSION = 2                 # bump when the prompt or `gloss_line` changes what a gloss line is
CONTEXT_CHARS = 600               # of the block shown above its lines (a config section, a message)
GLOSS_TOKENS_PER_BLOCK = 96       # a block's reply cap: every gloss of the block together
MAX_LINES_PER_BLOCK = 4           # value lines glossed per block (the first ones that name a value)
MAX_GLOSS_CHARS = 120
MAX_LINE_CHARS = 200              # a longer line is prose or a table: its own words say what it means
BOOK_BLOCKS = 8192                # blocks whose glosses are kept (LRU)
SYSTEM = "You explain lines of code and configuration in plain everyday words."
ASK = ("For each numbered line below, say in a short plain phrase (at most 12 words) what its value means, without "
       "repeating the line's names. Answer with one numbered phrase per line.")     # no example: small models copy it
MIN_GLOSS_WORDS = 3
# a name a line gives its value: snake_case, SCREAMING_CASE, camelCase, kebab-case, a dotted key or a --flag
_NAMED = re.compile(r"[A-Za-z][_-][A-Za-z0-9]|[a-z]\.[a-z]|[a-z][A-Z]|--[a-z]")
_NAME_TOKEN = re.compile(r"-{0,2}[A-Za-z_][A-Za-z0-9_.-]*")
# a glued name given a number: `NAME = 4500`, `"autosaveDelayMs": 900`, `--users 5090`, `--jobs=4`, `grace_days
# INTEGER NOT NULL DEFAULT 7`
_SETS_NUMBER = re.compile(
    r"""(?:[A-Za-z0-9][_.-]|[a-z][A-Z])[A-Za-z0-9_.-]*["'`]?\s*"""             # the glued name (a quote may close it)
    r"""(?:[:=]\s*["']?|\s+(?:[A-Z][A-Za-z0-9(), ]*?\bDEFAULT\s+)?)-?\d"""    # = : or a SQL type ... DEFAULT
    r"""|(?:^|\s)--?[A-Za-z][A-Za-z0-9_-]*(?:\s+|=)-?\d""")                   # or a flag and its number
_ANSWER = re.compile(r"^\s*(?P<n>\d{1,2})\s*[.):-]\s*(?P<gloss>\S.*?)\s*$")
_BULLET = re.compile(r"^\s*[-*\u2022]\s+(?P<gloss>\S.*?)\s*$")
_WRAPPING = " \t`'\"*"


def gloss_targets(lines: Iterable[str]) -> list[str]:
    """The lines of a block worth a gloss: they hold a value (`value_lines.holds_value`) under a name made of
    several words glued together (`STATUS_REFRESH_MS = 4500`, `"autosaveDelayMs": 900`, `--max-retries 3`), are
    short, and the glued name is not only a call's (`log.debug('load %s', item)`, `raise ValueError("no x")`: the
    value is an argument, the name says what runs, not what the value means). At most `MAX_LINES_PER_BLOCK`, no
    repeats: first the lines that set a number under the name (`NAME = 4500`, `key: 900`, `--users 5090`, a SQL
    column's `DEFAULT 7`), in order, then the others."""
    settings: list[str] = []
    others: list[str] = []
    for line in dict.fromkeys(lines):
        if len(line) <= MAX_LINE_CHARS and _names_a_value(line) and holds_value(line):
            (settings if _SETS_NUMBER.search(line) else others).append(line)
    return (settings + others)[:MAX_LINES_PER_BLOCK]


def _names_a_value(line: str) -> bool:
    """A glued name in `line` that is not only called (`_NAMED` on a token not followed by an opening bracket)."""
    return any(_NAMED.search(token.group(0)) and not line[token.end():].lstrip().startswith("(")
               for token in _NAME_TOKEN.finditer(line))


def gloss_messages(lines: list[str], source: str = "", text: str = "") -> list[dict[str, str]]:
    """The chat messages that ask the model for one gloss per line (rendered with the GGUF's own template). With
    `text`, the block the lines come from is shown first (cut to `CONTEXT_CHARS`, under `source`: its file's name):
    a line alone is misread (`drain_grace_seconds: 2795` was "the seconds water takes to drain from the tap")."""
    numbered = "\n".join(f"{i}. {line.strip()}" for i, line in enumerate(lines, 1))
    ask = f"{ASK}\n\n{numbered}"
    if text.strip():
        shown = text.strip()
        if len(shown) > CONTEXT_CHARS:
            shown = shown[:CONTEXT_CHARS].rsplit("\n", 1)[0] + "\n..."
        where = f" ({source})" if source else ""
        ask = f"Where the lines come from{where}:\n```\n{shown}\n```\n\n{ask}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}]


def parse_glosses(reply: str, lines: list[str]) -> dict[str, str]:
    """Line -> gloss from a numbered reply (`1. how often the status page reloads`). A reply without numbers: for one
    line its bullets (`- ...`) joined with "; " (a line that sets two values gets a bullet each), or its first row;
    for several lines the k-th bullet is line k's where there is one bullet a line. A number outside the lines, a
    phrase of fewer than `MIN_GLOSS_WORDS` words, one numbered again (`1. 1. how long`) or one that repeats its line
    or a name glued from words (`STATUS_REFRESH_MS = 450`: a copy, maybe with another value, says nothing in plain
    words) is dropped, and a reply whose numbered rows give nothing is read as one without numbers (a model that
    goes on with an example of its own, `2. [profile] ...`); a gloss is cut to `MAX_GLOSS_CHARS` at a word."""
    rows = [row for row in reply.splitlines() if row.strip()]
    out: dict[str, str] = {}
    for row in rows:
        answer = _ANSWER.match(row)
        index = int(answer.group("n")) - 1 if answer else -1
        if answer is None or not 0 <= index < len(lines) or lines[index] in out:
            continue
        if gloss := _plain(answer.group("gloss"), lines[index]):
            out[lines[index]] = _cut(gloss)
    if out:
        return out
    bullets = [m.group("gloss") for row in rows if (m := _BULLET.match(row))]
    if len(lines) == 1:
        said = [g for row in (bullets or rows[:1]) if (g := _plain(row, lines[0]))]
        return {lines[0]: _cut("; ".join(said))} if said else {}
    if len(bullets) != len(lines):
        return {}
    return {line: _cut(gloss) for line, text in zip(lines, bullets, strict=True) if (gloss := _plain(text, line))}


def _plain(text: str, line: str) -> str:
    """`text` as a gloss of `line`: unwrapped, or "" where it repeats the line, holds a glued name, is numbered again
    or is too short to say anything."""
    gloss = text.strip(_WRAPPING).rstrip(".").strip(_WRAPPING)
    if (not gloss or gloss.lower() == line.strip().lower() or _NAMED.search(gloss) or _ANSWER.match(gloss)
            or len(gloss.split()) < MIN_GLOSS_WORDS):
        return ""
    return gloss


def _cut(gloss: str) -> str:
    return gloss if len(gloss) <= MAX_GLOSS_CHARS else gloss[:MAX_GLOSS_CHARS].rsplit(" ", 1)[0]


def gloss_line(line: str, gloss: str) -> str:
    """A glossed line as the recall signals read it beside the line itself: the gloss, then the line (its value and
    names stay in it, so it is still a value line for `recall_value_lines`)."""
    return f"{gloss}: {line.strip()}"


class GlossBook:
    """Block content hash -> its glosses ((line, gloss) pairs, in line order), LRU-bounded; a block written with no
    gloss (the model gave none) is kept as written, so it is not asked again."""

    def __init__(self, capacity: int = BOOK_BLOCKS) -> None:
        self.capacity = capacity
        self._glosses: OrderedDict[str, tuple[tuple[str, str], ...]] = OrderedDict()
        self._suffix: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._glosses)

    def put(self, block_hash: str, glosses: dict[str, str]) -> None:
        pairs = tuple((line, gloss) for line, gloss in glosses.items() if line and gloss)
        self._glosses[block_hash] = pairs
        self._glosses.move_to_end(block_hash)
        digest = hashlib.sha256(repr(pairs).encode()).hexdigest()[:8]
        self._suffix[block_hash] = f"|g{GLOSS_VERSION}.{digest}" if pairs else ""
        while len(self._glosses) > self.capacity:
            old, _ = self._glosses.popitem(last=False)
            self._suffix.pop(old, None)

    def hashes(self) -> list[str]:
        """The blocks whose glosses were written, least recently put first."""
        return list(self._glosses)

    def written(self, block_hash: str) -> bool:
        """Whether the block's glosses were written (maybe none)."""
        return block_hash in self._glosses

    def of(self, block_hash: str) -> tuple[tuple[str, str], ...]:
        return self._glosses.get(block_hash, ())

    def lines(self, block_hash: str) -> list[str]:
        """The block's glossed lines as the recall signals read them (`gloss_line`), in line order."""
        return [gloss_line(line, gloss) for line, gloss in self.of(block_hash)]

    def suffix(self, block_hash: str) -> str:
        """What the block's line key carries for its glosses: empty without any, else their version and digest."""
        return self._suffix.get(block_hash, "")

    def export(self, hashes: Iterable[str]) -> dict[str, list[list[str]]]:
        """The glosses of these blocks (written ones, with none included) for a KV file: hash -> [[line, gloss]]."""
        return {h: [list(pair) for pair in self._glosses[h]] for h in dict.fromkeys(hashes) if h in self._glosses}

    def seed(self, records: dict[str, list[list[str]]]) -> int:
        """Glosses read from a KV file (`export`'s form); blocks already written here keep theirs. The count added."""
        added = 0
        for block_hash, pairs in records.items():
            if block_hash not in self._glosses:
                self.put(block_hash, {line: gloss for line, gloss in pairs})
                added += 1
        return added

    def clear(self) -> None:
        self._glosses.clear()
        self._suffix.clear()


BOOK = GlossBook()


def glosses_of(head_glosses: object) -> dict[str, list[list[str]]]:
    """A KV file head's "glosses" (absent in files written before them: none), checked: hash -> [[line, gloss]];
    anything else is ValueError."""
    if head_glosses is None:
        return {}
    if not isinstance(head_glosses, dict):
        raise ValueError("glosses is not an object")
    for block_hash, pairs in head_glosses.items():
        if not (isinstance(block_hash, str) and isinstance(pairs, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs)):
            raise ValueError(f"glosses of {str(block_hash)[:20]} are not [[line, gloss]]")
    return head_glosses
