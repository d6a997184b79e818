"""Lines read as words for the recall signals (issue 61), and a structured line spelled out with its context for the
embedder.

`read_as_words` reads every identifier of a line as words with the common code abbreviations expanded
(`export const STATUS_REFRESH_MS = 4500;` -> `export const status refresh milliseconds = 4500;`, `"autosaveDelayMs"`
-> `"autosave delay milliseconds"`, `841s` -> `841 seconds`); `expansions` lists the words the abbreviations of a line
stand for (what the lexical signal adds to the line). A short abbreviation that is also an English word or a letter
(`s`, `min`, `max`, `us`, `h`) is expanded only as a part of an identifier or as a unit after a number; `min` is
minutes after a number or at an identifier's end, minimum elsewhere.

The spelled-out form: a line that states a value in a structured form
(a YAML or TOML key, a module constant `NAME = value`, an env line `NAME=value`, a command line's `--flag value`)
is read as its file's name, its parent keys and its identifier split into words, so that a question in other words
meets it (`  pool_size: 20` under `database:` in `deploy.yaml` -> `deploy yaml database pool size: 20`).

Invariants: pure functions of plain strings; `read_as_words` changes only identifiers, abbreviations and a number's
glued unit (prose words, numbers and punctuation stay); in `spell_out`, only lines whose value is a scalar (a number,
a quoted string, one bare word, true/false) are rewritten, every other line is returned as it was; parents are found
in the text itself and in `before` (the same file's earlier text), nearest first, at most `MAX_PARENTS`; `spell_out`
keeps the number and order of lines.
"""

from __future__ import annotations

import re

MAX_PARENTS = 3
# `key: value` (YAML) or `key = value` / `KEY=value` (TOML, INI, a module constant, an env file)
_KEY_VALUE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)\s*(?P<sep>:|=)\s*(?P<value>\S.*?)\s*$")
_YAML_PARENT = re.compile(r"^(?P<indent>\s*)(?:-\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)\s*:\s*(?:#.*)?$")
# a JSON object's or array's key (`  "editor": {`), a code declaration's keywords (`export const`, `final int`)
_JSON_PARENT = re.compile(r'^(?P<indent>\s*)"(?P<key>[^"\n]{1,60})"\s*:\s*[{\[]\s*$')
_JSON_KEY_VALUE = re.compile(r'^(?P<indent>\s*)"(?P<key>[A-Za-z_][^"\n]{0,60})"\s*:\s*(?P<value>\S.*?),?\s*$')
_DECLARATION = re.compile(r"^(?P<indent>\s*)(?:export\s+)?(?:(?:const|let|var|val|final|static|public|private|"
                          r"readonly|pub)\s+)+(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?:\s*:\s*[A-Za-z_][\w<>\[\]|. ]*)?"
                          r"\s*=\s*(?P<value>[^=].*?);?\s*$")
# a SQL name, bare or quoted (`"break_minutes"`, MySQL's backticks, T-SQL's brackets), and one with its schema
_SQL_NAME = r'(?:"[^"\n]{1,60}"|`[^`\n]{1,60}`|\[[^\]\n]{1,60}\]|[A-Za-z_][A-Za-z0-9_$]*)'
_SQL_QUALIFIED = rf"{_SQL_NAME}(?:\.{_SQL_NAME})?"
# a SQL column with a default (`  grace_days INTEGER NOT NULL DEFAULT 7,`) and the table it is a column of
_SQL_COLUMN = re.compile(rf"^\s*(?P<key>{_SQL_NAME})\s+[A-Za-z]+\b(?:\s*\([\d\s,]*\))?[^,]*?"
                         r"\bDEFAULT\s+(?P<value>[^,\s]+)[^,]*,?\s*$", re.IGNORECASE)     # a type's (5, 2) included
_SQL_TABLE = re.compile(r"^\s*CREATE\s+(?:TEMP(?:ORARY)?\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"
                        rf"(?P<name>{_SQL_QUALIFIED})", re.IGNORECASE)
# a default set by a migration (`ALTER TABLE shifts ADD COLUMN break_minutes INT DEFAULT 30;`, `ALTER TABLE ONLY
# public.shifts ALTER COLUMN break_minutes SET DEFAULT 30;`): the table is on the line
_SQL_ALTER = re.compile(r"^\s*ALTER\s+TABLE\s+(?:ONLY\s+)?(?:IF\s+EXISTS\s+)?"
                        rf"(?P<table>{_SQL_QUALIFIED})\s+(?:ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?|"
                        rf"ALTER\s+(?:COLUMN\s+)?)(?P<key>{_SQL_NAME})\s.*?\bDEFAULT\s+(?P<value>[^,;\s]+)",
                        re.IGNORECASE)
# a YAML list item that is one scalar (`      - "8080:80"` under `ports:`)
_LIST_ITEM = re.compile(r"^\s*-\s+(?P<value>\S.*?)\s*$")
_SECTION = re.compile(r"^\s*\[\[?(?P<name>[A-Za-z0-9_.\- \"']+)\]\]?\s*(?:#.*)?$")
_SCALAR = re.compile(r"""^(?:[-+]?\d[\w.:/+-]*%?|"[^"]{0,80}"|'[^']{0,80}'|true|false|yes|no|on|off|null|none|"""
                     r"""True|False|None|[A-Za-z0-9_./:@+-]{1,60})\s*(?:#.*)?,?$""")
# what `bare_declaration` drops: a declaration's keywords before a name that is assigned and the name's type, and a
# SQL column's type (its size or precision included) and NOT NULL before DEFAULT
_DECLARING = re.compile(r"(?<![\w.])(?:export\s+)?(?:(?:const|let|var|val|final|static|public|private|readonly|pub)"
                        r"\s+)+"
                        r"(?P<name>[A-Za-z_]\w*)(?:\s*:\s*[A-Za-z_][\w<>\[\]|. ]*?)?(?=\s*=(?!=))")
_COLUMN_TYPE = re.compile(r"(?<=[\w\"`\]])"                    # after a name, bare or quoted
                          r"\s+[A-Za-z]+(?:\s*\(\s*\d+(?:\s*,\s*\d+)?\s*\))?(?:\s+NOT\s+NULL)?(?=\s+DEFAULT\s)",
                          re.IGNORECASE)
_FLAG = re.compile(r"^--?(?P<name>[A-Za-z][A-Za-z0-9-]*?)(?:=(?P<joined>.+)|(?P<attached>(?<=^-[A-Za-z])\d\S*))?$")
_PROGRAM = re.compile(r"^[A-Za-z0-9_./-]+$")
_CASE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z0-9]+|[A-Z0-9]+")      # digits stay in their word: k8s
_PATH_WORD = re.compile(r"[A-Za-z0-9]+")

# General code abbreviations (the list and the usual ones of identifiers and units; no workload's words).
ABBREVIATIONS = {
    "ms": "milliseconds", "msec": "milliseconds", "millis": "milliseconds", "us": "microseconds",
    "usec": "microseconds", "ns": "nanoseconds", "s": "seconds", "sec": "seconds", "secs": "seconds",
    "mins": "minutes", "hr": "hours", "hrs": "hours", "h": "hours", "kb": "kilobytes", "mb": "megabytes",
    "gb": "gigabytes", "kib": "kibibytes", "mib": "mebibytes", "gib": "gibibytes", "hz": "hertz", "px": "pixels",
    "pct": "percent", "max": "maximum", "num": "number", "cnt": "count", "cfg": "configuration",
    "conf": "configuration", "config": "configuration", "db": "database", "tz": "timezone", "ttl": "time to live",
    "dir": "directory", "env": "environment", "repo": "repository", "mem": "memory", "buf": "buffer",
    "len": "length", "idx": "index", "msg": "message", "msgs": "messages", "req": "request", "reqs": "requests",
    "resp": "response", "conn": "connection", "conns": "connections", "addr": "address", "tmp": "temporary",
    "src": "source", "dst": "destination", "pwd": "password", "passwd": "password", "img": "image",
    "avg": "average", "prev": "previous", "seq": "sequence", "auth": "authentication", "k8s": "kubernetes",
    "btn": "button", "svc": "service", "mgr": "manager", "qty": "quantity", "opts": "options", "args": "arguments",
    "params": "parameters", "init": "initial", "ver": "version", "err": "error", "errs": "errors",
    "cpu": "processor", "gc": "garbage collection", "ws": "websocket", "ui": "interface", "api": "interface"}
# expanded only inside an identifier or as a unit after a number: English words or single letters on their own
_ONLY_IN_NAMES = frozenset({"s", "us", "h", "max", "min", "len", "init", "ver", "args", "opts", "params", "ui",
                            "api", "cpu", "conf", "config", "sec", "err", "seq", "prev", "img", "ws", "gc"})
_WORDLIKE = re.compile(r"(?<![\w.])(?P<num>\d+(?:\.\d+)?)(?P<unit>[A-Za-z]+)\b|[A-Za-z_][A-Za-z0-9_]*")
_NUMBER_BEFORE = re.compile(r"\d(?:\.\d+)?\s*$")


def _expand(part: str, *, last: bool, in_name: bool, after_number: bool) -> str:
    """One lowercased word of a line, its abbreviation expanded where that reading is safe."""
    if part == "min":
        if after_number or (in_name and last):
            return "minutes"
        return "minimum" if in_name else part
    if part not in ABBREVIATIONS or (part in _ONLY_IN_NAMES and not (in_name or after_number)):
        return part
    return ABBREVIATIONS[part]


def read_as_words(line: str) -> str:
    """`line` with each identifier read as lowercased words and the common abbreviations expanded (`retry_budget` ->
    `retry budget`, `autosaveDelayMs` -> `autosave delay milliseconds`, `4047 s` and `841s` -> `... seconds`, `the
    db` -> `the database`); prose words, numbers and punctuation as written."""
    def word(match: re.Match) -> str:
        if match.group("num"):
            unit = match.group("unit").lower()
            spelled = _expand(unit, last=True, in_name=False, after_number=True)
            return f"{match.group('num')} {spelled}" if spelled != unit else match.group(0)
        token = match.group(0)
        if token.isalpha() and token.islower() and token not in ABBREVIATIONS and token != "min":
            return token                                     # a plain word (most of a line): as written, at once
        parts = identifier_words(token).split()
        in_name = len(parts) > 1
        if not parts:
            return token
        after = not in_name and bool(_NUMBER_BEFORE.search(line[:match.start()]))
        spelled = [_expand(p, last=i == len(parts) - 1, in_name=in_name, after_number=after)
                   for i, p in enumerate(parts)]
        if not in_name and spelled[0] == parts[0]:
            return token                                     # a plain word stays as written
        return " ".join(spelled)
    return _WORDLIKE.sub(word, line)


def bare_declaration(line: str) -> str:
    """A line without the syntax that declares a name, which no question asks about: a declaration's keywords and
    type (`export const STATUS_REFRESH_MS = 4500;` -> `STATUS_REFRESH_MS = 4500;`), a SQL column's type and NOT NULL
    before its DEFAULT (`grace_days INTEGER NOT NULL DEFAULT 7,` -> `grace_days DEFAULT 7,`), also after a short
    line joined in front of it (`block_lines`); names, values and every other word as written."""
    return _DECLARING.sub(r"\g<name>", _COLUMN_TYPE.sub("", line))


def expansions(line: str) -> list[str]:
    """The words `read_as_words` writes for `line`'s abbreviations and split identifiers that the line does not
    hold as written (`CURSOR_BLINK_MS = 530` -> `cursor`, `blink`, `milliseconds`): what the lexical signal adds."""
    held = set(_PATH_WORD.findall(line.lower()))
    return [w for w in dict.fromkeys(_PATH_WORD.findall(read_as_words(line).lower()))
            if w not in held and not w.isdigit()]


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
        parent = _YAML_PARENT.match(line) or _JSON_PARENT.match(line)
        if parent and own < indent:
            found.append(parent.group("key"))
            indent = own
        if own == 0 and found:
            break
        if len(found) >= MAX_PARENTS:
            break
    return [identifier_words(key) for key in reversed(found)]


def _unquoted(name: str) -> str:
    """A SQL name without its quotes (`"public"."shifts"` -> `public.shifts`)."""
    return re.sub(r'["`\[\]]', "", name)


def sql_table(lines: list[str], at: int) -> str | None:
    """The table whose `CREATE TABLE` line `at` is in (the nearest one above, before a line that closes it)."""
    for line in reversed(lines[:at]):
        table = _SQL_TABLE.match(line)
        if table:
            return _unquoted(table.group("name"))
        if line.strip().startswith(")"):
            return None
    return None


def spell_key_value(lines: list[str], at: int, file_name: str | None) -> str | None:
    """Line `at` spelled out when it states a scalar value under a name: `key: value` or `key = value` (YAML, TOML,
    env, a module constant), a JSON `"key": value`, a code declaration (`export const NAME = value;`), a SQL column's
    `DEFAULT value` (with its table; a migration's `ALTER TABLE` names it on the line) or a YAML list item (`-
    "8080:80"` under `ports:`): file words, parent keys (a YAML key's or a JSON object's, outermost first; a SQL
    table), the name's words, the separator and the value; None when it is none of these."""
    line = lines[at]
    head = [file_words(file_name)] if file_name else []
    altered = _SQL_ALTER.match(line)
    column = None if altered else _SQL_COLUMN.match(line)
    table = _unquoted(altered.group("table")) if altered else None
    if column and not _SQL_TABLE.match(line):
        table = sql_table(lines, at)
    if table is not None:
        default = altered or column
        name = identifier_words(_unquoted(default.group("key")))
        return " ".join([*head, "table", identifier_words(table), f"{name} default {default.group('value')}"]).strip()
    item = _LIST_ITEM.match(line)
    if item and _SCALAR.match(item.group("value")) and not item.group("value").endswith(":"):
        above = parents(lines, at)
        if above:
            return " ".join([*head, *above, item.group("value")]).strip()
    match = _KEY_VALUE.match(line) or _JSON_KEY_VALUE.match(line) or _DECLARATION.match(line)
    if not match or not _SCALAR.match(match.group("value")) or "==" in line:
        return None
    head += parents(lines, at)
    key = identifier_words(match.group("key"))
    sep = match.groupdict().get("sep") or ("=" if match.re is _DECLARATION else ":")
    separator = ":" if sep == ":" else " ="
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
