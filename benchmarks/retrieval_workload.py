"""The held-out retrieval workload: coding sessions with facts written as code, config, docs, scripts and stack
traces, asked in other words than the suite's. Nothing is tuned on it; it is reported apart from the suite.

Invariants: a session is a pure function of its seed; every fact value is unique in its session (look-alike
lines carry other values), so a block holding the fact's line holds the fact; `Fact.statement` is the exact line
as it appears in the file or message; every turn carries its canned reply (`Turn.reply`).
"""

from __future__ import annotations

import random

from .recall_workload import Fact, Session, Turn

FACT_TYPES = ("constant", "default_arg", "config_key", "doc", "script", "trace")

WORDS = ["ledger", "invoice", "shard", "tenant", "webhook", "payout", "coupon", "receipt", "session", "upload",
         "thumbnail", "export", "audit", "refund", "billing", "catalog", "search", "report", "quota", "badge"]


def _num(rng: random.Random) -> str:
    return str(rng.choice([rng.randint(101, 999), rng.randint(1001, 9999)]))


# type -> frames: (line with {v}, file kinds it fits, questions, value maker). Questions avoid the line's words.
FRAMES: dict[str, list[tuple[str, tuple[str, ...], list[str], str]]] = {
    "constant": [
        ("MAX_UPLOAD_CHUNK_BYTES = {v}", ("py",), ["How large is each piece when we stream a big file to the server?",
                                                  "What size are the slices a large attachment is sent in?"], "num"),
        ("export const RETRY_CEILING = {v};", ("ts",), ["How many times will the client try again before it gives up?",
                                                       "What caps the number of repeated attempts in the frontend?"],
         "num"),
        ("SESSION_IDLE_MINUTES = {v}", ("py",), ["After how long without activity is somebody logged out?",
                                                "When does an inactive login expire?"], "num"),
        ("const PAGE_WINDOW = {v};", ("ts",), ["How many rows does one screen of the table list?",
                                              "What is the list view's page length?"], "num"),
    ],
    "default_arg": [
        ("def connect(host: str, port: int = 5432, timeout_ms: int = {v}):", ("py",),
         ["How long does the DB helper wait for a handshake unless told otherwise?",
          "If I don't pass a limit, when does opening the database link give up?"], "num"),
        ("export function backoff(attempt: number, baseDelay = {v}) {{", ("ts",),
         ["What starting pause does the retry helper use when the caller leaves it out?",
          "Which initial wait is assumed between repeated requests?"], "num"),
        ("def resize(image, *, quality={v}, keep_exif=False):", ("py",),
         ["At what compression level are pictures saved when nobody specifies one?",
          "Which JPEG setting do shrunk photos get out of the box?"], "num"),
    ],
    "config_key": [
        ("  pool_size: {v}", ("yaml",), ["How many database handles does the service keep open?",
                                        "What is the size of the connection reservoir?"], "num"),
        ('  "maxConcurrentJobs": {v},', ("json",), ["How many tasks may the worker run side by side?",
                                                    "What is the parallelism limit of the job runner?"], "num"),
        ('region = "{v}"', ("toml",), ["Which cloud location do we deploy into?",
                                       "In what datacenter area does the stack run?"], "region"),
        ("  log_level: {v}", ("yaml",), ["How verbose is the logging in production?",
                                        "What severity threshold is set for the service's output?"], "level"),
    ],
    "doc": [
        ("- Releases are cut every {v} weeks from the main branch.", ("md",),
         ["How often do we ship a new version?", "What is the cadence between two tags?"], "num"),
        ("The public API is rate limited to {v} calls per minute per key.", ("md",),
         ["How many requests can one token make in sixty seconds?", "What throttle applies to external clients?"],
         "num"),
        ("Ownership: the search indexer is maintained by {v}.", ("md",),
         ["Who do I ask about the thing that builds the lookup index?",
          "Which person looks after query indexing?"], "person"),
    ],
    "script": [
        ('BACKUP_BUCKET="{v}"', ("sh",), ["Where do the nightly dumps get copied to?",
                                          "What storage target receives the database snapshots?"], "bucket"),
        ("pg_dump --jobs={v} --format=directory \"$DB_URL\"", ("sh",),
         ["How many parallel workers does the dump use?", "With what degree of concurrency is the database exported?"],
         "num"),
        ('export DEPLOY_USER="{v}"', ("sh",), ["Which account does the release script log in as?",
                                               "Under what username are the servers updated?"], "user"),
    ],
    "trace": [
        ('  File "app/{w}/service.py", line {v}, in settle', ("trace",),
         ["On which line did the crash I pasted happen?", "Where exactly in the source did that exception come from?"],
         "num"),
        ("    at {v} (src/{w}/handler.ts:88:17)", ("trace",),
         ["Which function was on top when the Node error was thrown?",
          "What routine blew up in the traceback from earlier?"], "ident"),
    ],
}

INSTRUCTION = {"constant": "Just the value, please.", "default_arg": "Give me the number only.",
               "config_key": "Reply with the setting's value.", "doc": "Short answer.",
               "script": "Only the value.", "trace": "Be precise."}

PEOPLE = ["Noor Haddad", "Lars Ek", "Mina Cho", "Oskar Brandt", "Zuri Mwangi", "Tariq Aziz", "Ines Duarte", "Kai Lund"]
REGIONS = ["eu-central-2", "ap-south-1", "us-west-3", "sa-east-1", "ca-central-1", "me-south-1"]
LEVELS = ["warning", "notice", "error", "critical", "verbose"]
USERS = ["deploybot", "release_ops", "ci-runner", "shipit", "rollout_svc"]


def _value(maker: str, rng: random.Random, used: set[str]) -> str:
    for _ in range(200):
        if maker == "num":
            value = _num(rng)
        elif maker == "region":
            value = rng.choice(REGIONS)
        elif maker == "level":
            value = rng.choice(LEVELS)
        elif maker == "person":
            value = rng.choice(PEOPLE)
        elif maker == "bucket":
            value = f"s3://{rng.choice(WORDS)}-{rng.choice(WORDS)}-backups"
        elif maker == "user":
            value = rng.choice(USERS)
        else:
            value = f"{rng.choice(['handle', 'apply', 'settle', 'commit'])}{rng.choice(WORDS).capitalize()}"
        if value not in used:
            used.add(value)
            return value
    raise RuntimeError(f"no unique {maker} value")


FILLER = {
    "py": ["import logging", "from dataclasses import dataclass", "log = logging.getLogger(__name__)", "",
           "def normalize(name: str) -> str:", "    return name.strip().lower()", "",
           "@dataclass", "class Record:", "    key: str", "    payload: dict", "",
           "def chunked(items, size):", "    for i in range(0, len(items), size):", "        yield items[i:i + size]",
           "", "def load(path):", "    with open(path) as handle:", "        return handle.read()"],
    "ts": ["import { z } from 'zod';", "", "export interface Item { id: string; title: string }", "",
           "export function byId(items: Item[], id: string) {", "  return items.find((i) => i.id === id);", "}", "",
           "export const schema = z.object({ id: z.string() });", "", "function sleep(ms: number) {",
           "  return new Promise((r) => setTimeout(r, ms));", "}"],
    "yaml": ["service:", "  name: api", "  replicas: 3", "database:", "  host: db.internal", "  sslmode: require",
             "cache:", "  backend: redis", "features:", "  dark_mode: true", "  beta_banner: false"],
    "json": ["{", '  "name": "worker",', '  "queue": "default",', '  "retry": {"enabled": true},',
             '  "metrics": {"port": 9102},', '  "tracing": false', "}"],
    "toml": ["[package]", 'name = "infra"', 'version = "0.4.1"', "", "[deploy]", 'strategy = "rolling"',
             "canary = true", "", "[alerts]", 'channel = "#ops"'],
    "md": ["# Engineering handbook", "", "## Workflow", "- Every change goes through a pull request.",
           "- CI must be green before merge.", "", "## Services", "The API is stateless and scales horizontally.",
           "Background work goes through the queue.", "", "## On-call", "Pages go to the rotation in the tracker."],
    "sh": ["#!/usr/bin/env bash", "set -euo pipefail", 'cd "$(dirname "$0")/.."', 'echo "starting"',
           'DB_URL="${DATABASE_URL:?missing}"', 'mkdir -p "$OUT_DIR"', 'tar -czf "$OUT_DIR/site.tgz" public/',
           'echo "done"'],
}
FILE_NAMES = {"py": ["app/settings.py", "app/storage/uploads.py", "lib/db.py"], "ts": ["web/src/api.ts",
              "web/src/table.ts"], "yaml": ["deploy/values.yaml", "config/app.yaml"], "json": ["worker.json"],
              "toml": ["infra.toml"], "md": ["docs/HANDBOOK.md", "CONTRIBUTING.md"], "sh": ["scripts/backup.sh",
              "scripts/release.sh"]}

FILLER_TURNS = [
    ("explain", "What is the difference between a process and a thread?", 120,
     "A process has its own address space; threads inside one process share memory and file handles. Threads are "
     "cheaper to start and to switch between, but a bug in one can corrupt state the others see. In Python the GIL "
     "means CPU-bound threads do not run in parallel, so multiprocessing is the usual choice for that work."),
    ("explain", "Why would a SQL query get slower as a table grows?", 100,
     "Usually because it scans: without an index on the filtered or joined columns the database reads every row. "
     "Check the plan with EXPLAIN ANALYZE, add an index that matches the WHERE clause, and watch for functions on "
     "indexed columns, which stop the index from being used."),
    ("review", "Can you review this?\n\n```python\ndef total(xs):\n    s = 0\n    for x in xs:\n        s = s + x\n"
     "    return s\n```", 90, "It works, but `sum(xs)` says the same thing in one call and is faster. If xs can hold "
     "None, filter first. A type hint (`list[float]`) and a docstring would help the next reader."),
    ("git", "How do I undo my last commit but keep the changes?", 60,
     "Run `git reset --soft HEAD~1`: the commit goes away and its changes stay staged. Use `--mixed` to keep them "
     "unstaged instead. If you already pushed, prefer `git revert` so others' history is not rewritten."),
    ("regex", "Write a regex that matches an ISO date like 2024-05-01.", 60,
     "`^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$` checks the shape and the month and day ranges; it does not "
     "know that February has no 30th, so parse with `datetime.date.fromisoformat` when that matters."),
]
PROBE_REPLIES = ["Looking back at what you shared, let me check.", "I would need to look at the files again."]


def file_with(filler: list[str], facts: list[str], rng: random.Random) -> str:
    """A file's text: its `filler` lines with each fact line inserted at a seeded place after the first."""
    lines = list(filler)
    for line in facts:
        lines.insert(rng.randint(1, len(lines)), line)
    return "\n".join(lines)


def make_session(seed: int, *, probes: int = 3) -> Session:
    """Files of 3-4 kinds holding five facts and a look-alike line each, a pasted stack trace with the sixth,
    fillers with their own replies, then `probes` probes (types rotate with the seed)."""
    rng = random.Random(seed * 104729 + 3)
    used: set[str] = set()
    facts: list[Fact] = []
    placed: dict[str, list[str]] = {}
    trace_lines: list[str] = []
    for kind in FACT_TYPES:
        order = rng.sample(range(len(FRAMES[kind])), len(FRAMES[kind]))
        for rank, index in enumerate(order[:2]):                  # the fact, then one look-alike
            line, kinds, asks, maker = FRAMES[kind][index]
            value = _value(maker, rng, used)
            text = line.format(v=value, w=rng.choice(WORDS))
            if kind == "trace":
                trace_lines.append(text)
            else:
                placed.setdefault(kinds[0], []).append(text)
            if rank == 0:
                facts.append(Fact(kind=kind, frame=index, statement=text, question=rng.choice(asks), value=value,
                                  answer_tokens=[value], where="trace" if kind == "trace" else f"file:{kinds[0]}"))
    chat_fact = rng.choice([f for f in facts if f.kind in ("doc", "constant", "config_key")])
    for lines in placed.values():
        if chat_fact.statement in lines:
            lines.remove(chat_fact.statement)
    chat_fact.where = "chat"
    attachments = [(rng.choice(FILE_NAMES[kind]), file_with(FILLER[kind], lines, rng))
                   for kind, lines in placed.items() if lines]
    rng.shuffle(attachments)
    trace = "Traceback (most recent call last):\n" + "\n".join(
        [f'  File "app/main.py", line {rng.randint(10, 60)}, in run', *trace_lines,
         f"KeyError: '{rng.choice(WORDS)}_id'"])
    turns = [Turn("attach", "I'm attaching the relevant parts of the repo. Skim them, nothing to do yet.", 20,
                  attachments=attachments[:2], reply="Got it, I've looked through them."),
             Turn("attach", "And these too.", 10, attachments=attachments[2:], reply="Thanks, read those as well."),
             Turn("chat_fact", f"One thing that is not in the files, we changed it by hand:\n{chat_fact.statement}\n"
                  "Keep it in mind.", 10, reply="Will do.")]
    fillers = [Turn(kind, text, tokens, reply=reply) for kind, text, tokens, reply in rng.sample(FILLER_TURNS, 3)]
    crash = Turn("trace", f"The worker crashed overnight with this:\n\n{trace}\n\nAny idea?", 80,
                 reply="The exception is a missing key in a dict lookup deep in the call chain; the frame list shows "
                       "where it was raised. Guard the lookup with `.get` or validate the payload before it arrives.")
    fillers.insert(rng.randrange(len(fillers) + 1), crash)
    turns += fillers
    offset = seed * probes
    for i in range(probes):
        fact = facts[(offset + i) % len(facts)]
        turns.append(Turn("probe", f"{fact.question} {INSTRUCTION[fact.kind]}", 32, fact=fact,
                          reply=rng.choice(PROBE_REPLIES)))
    return Session(seed=seed, facts=facts, probed=[t.fact for t in turns if t.fact], turns=turns)
