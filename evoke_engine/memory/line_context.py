"""A structured line spelled out with its context for the embedder: a line that states a value in a structured form
(a YAML or TOML key, a module constant `NAME = value`, an env line `NAME=value`, a command line's `--flag value`)
is read as its file's name, its parent keys and its identifier split into words, so that a question in other words
meets it (`  pool_size: 20` under `database:` in `deploy.yaml` -> `deploy yaml database pool size: 20`).

Invariants: pure functions of plain strings; only lines whose value is a scalar (a number, a quoted string, one bare
word, true/false) are rewritten, every other line is returned as it was; parents are found in the text itself and
in `before` (the same file's earlier text), nearest first, at most `MAX_PARENTS`; `spell_out` keeps the number and
order of lines.
"""

from __future__ import annotations

import re

MAX_PARENTS = 3
# `key: value` (YAML) or `key = value` / `KEY=value` (TOML, INI, a module constant, an env file)
_KEY_VALUE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)\s*(?P<sep>:|=)\s*(?P<value>\S.*?)\s*$")
_YAML_PARENT = re.compile(r"^(?P<indent>\s*)(?:-\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)\s*:\s*(?:#.*)?$")
_SECTION = re.compile(r"^\s*\[\[?(?P<name>[A-Za-z0-9_.\- \"']+)\]\]?\s*(?:#.*)?$")
_SCALAR = re.compile(r"""^(?:[-+]?\d[\w.:/+-]*%?|"[^"]{0,80}"|'[^']{0,80}'|true|false|yes|no|on|off|null|none|"""
                     r"""True|False|None|[A-Za-z0-9_./:@+-]{1,60})\s*(?:#.*)?,?$""")
_FLAG = re.compile(r"^--?(?P<name>[A-Za-z][A-Za-z0-9-]*?)(?:=(?P<joined>.+)|(?P<attached>(?<=^-[A-Za-z])\d\S*))?$")
_PROGRAM = re.compile(r"^[A-Za-z0-9_./-]+$")
_CASE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z0-9]+|[A-Z0-9]+")      # digits stay in their word: k8s
_PATH_WORD = re.compile(r"[A-Za-z0-9]+")


def identifier_words(name: str) -> str:
    """An identifier as words: snake_case, SCREAMING_CASE, camelCase, kebab-case and dotted names split, lowercased
    (`maxRetries`, `MAX_RETRIES`, `--max-retries` -> `max retries`)."""
    return " ".join(p.lower() for piece in re.split(r"[_.\-\s]+", name.strip("-_")) for p in _CASE.findall(piece))


def file_words(file_name: str) -> str:
    """A file's path as words (`deploy/database.yaml` -> `deploy database yaml`)."""
    return " ".join(identifier_words(word) for word in _PATH_WORD.findall(file_name))


def parents(lines: list[str], at: int) -> list[str]:
    """The keys above line `at`, outermost first: YAML keys with no value at a smaller indentation, or the nearest
    TOML/INI `[section]` header (a header ends the search: a TOML file has no deeper nesting by indentation)."""
    indent = len(lines[at]) - len(lines[at].lstrip())
    found: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        section = _SECTION.match(line)
        if section:
            found.append(section.group("name").strip("\"' "))
            break
        own = len(line) - len(line.lstrip())
        parent = _YAML_PARENT.match(line)
        if parent and own < indent:
            found.append(parent.group("key"))
            indent = own
        if own == 0 and found:
            break
        if len(found) >= MAX_PARENTS:
            break
    return [identifier_words(key) for key in reversed(found)]


def spell_key_value(lines: list[str], at: int, file_name: str | None) -> str | None:
    """Line `at` spelled out when it is a `key: value` or `key = value` line with a scalar value: file words, parent
    keys, the key's words, the separator and the value; None when it is not one."""
    match = _KEY_VALUE.match(lines[at])
    if not match or not _SCALAR.match(match.group("value")) or "==" in lines[at]:
        return None
    head = [file_words(file_name)] if file_name else []
    head += parents(lines, at)
    key = identifier_words(match.group("key"))
    separator = ":" if match.group("sep") == ":" else " ="
    return " ".join([*head, f"{key}{separator} {match.group('value')}"]).strip()


def spell_command(line: str) -> str | None:
    """A command line's flags as words with their values, positional arguments as written (`$ pg_dump --jobs 12
    --format directory` -> `command pg dump: jobs 12, format directory`); None when the line is no command (no flag,
    a sentence's end, a first word that is no program name)."""
    words = line.split()
    if words and words[0] == "$":
        words = words[1:]
    if len(words) < 2 or not _PROGRAM.match(words[0]) or words[0].startswith("-") or line.rstrip()[-1] in ".?!:":
        return None
    flags = []
    i = 1
    while i < len(words):
        flag = _FLAG.match(words[i])
        i += 1
        if not flag:
            flags.append(words[i - 1])                 # a positional argument, as written
            continue
        value = flag.group("joined") or flag.group("attached")
        if value is None and i < len(words) and not words[i].startswith("-"):
            value, i = words[i], i + 1
        name = identifier_words(flag.group("name"))
        flags.append(f"{name} {value}" if value else name)
    if not any(_FLAG.match(word) for word in words[1:]):
        return None
    return f"command {identifier_words(words[0].rsplit('/', 1)[-1])}: {', '.join(flags)}"


def spell_out(text: str, file_name: str | None = None, before: str = "") -> str:
    """`text` with each structured line spelled out (`spell_key_value`; a line with flags: `spell_command`), every
    other line as written; `before` is the same file's text ahead of `text`, read for parent keys only."""
    prior = before.splitlines()
    lines = text.splitlines()
    context = prior + lines
    out = []
    for i, line in enumerate(lines):
        spelled = spell_key_value(context, len(prior) + i, file_name) or spell_command(line)
        out.append(spelled or line)
    return "\n".join(out)
