"""`bench long`'s coding session, generated from a seed: attached files of five kinds, code requests, pasted logs
and stack traces, short questions, re-uploads, facts planted early (in files and in chat) and probed late.

Invariants: a session is a pure function of (seed, target tokens) and needs no model (tokens are estimated from
characters; the bench reports the counted ones); every reply has a fixed length in tokens, the same for every
system; every planted fact value is unique in the session, so a message holding the value holds the fact; no
re-upload repeats a file that holds a probed fact; probes come in the last quarter of the session, after the
turn the recall comparison is taken at. Nothing in the engine reads this module.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .recall_workload import CODE_FILLERS, FACT_TYPES, INSTRUCTION, SHORT_FILLERS, Fact, log_lines, make_fact

CHARS_PER_TOKEN = 2.8           # SmolLM2's tokenizer on this mix; the bench prints the counted tokens
REPLY_TOKENS = {"attach": 16, "reupload": 16, "code": 96, "log": 40, "trace": 40, "short": 24, "chat_fact": 8,
                "probe": 24}
COMPARABLE = ("short", "code")  # turns whose message is a short question: their first tokens compare across turns
WORDS = ["cache", "retry", "socket", "parser", "ledger", "window", "thread", "budget", "token", "shard", "queue",
         "router", "session", "schema", "bucket", "lease", "cursor", "tenant", "widget", "report"]
QUESTIONS = ["Why would {f} return None here?", "Can you explain what {f} does in one paragraph?",
             "Is there a race condition in {f}?", "How should I test {f}?", "Rename {f} to something clearer.",
             "What is the time complexity of {f}?", "Where is {f} called from?", "Should {f} be async?"]
CODE_ASKS = ["Refactor {f} so that it takes a config object instead of keyword arguments.",
             "Add retries with exponential backoff to {f}.", "Write unit tests for {f} with pytest.",
             "Port {f} to TypeScript.", "Add type hints and a docstring to {f}.",
             "Rewrite {f} to stream its results instead of building a list."]


@dataclass
class LongTurn:
    index: int
    kind: str                   # attach | reupload | code | log | trace | short | chat_fact | probe
    text: str
    reply_tokens: int
    attachments: list[tuple[str, str]] = field(default_factory=list)
    fact: Fact | None = None    # probe: the fact asked for
    planted: list[str] = field(default_factory=list)   # fact values this turn's message holds

    @property
    def estimated_tokens(self) -> int:
        chars = len(self.text) + sum(len(name) + len(body) + 40 for name, body in self.attachments)
        return int(chars / CHARS_PER_TOKEN) + 8 + self.reply_tokens


@dataclass
class LongSession:
    seed: int
    target_tokens: int
    turns: list[LongTurn]
    facts: list[Fact]           # planted, in planting order
    probed: list[Fact]

    @property
    def estimated_tokens(self) -> int:
        return sum(t.estimated_tokens for t in self.turns)


def _ident(rng: random.Random) -> str:
    return f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"


def _python_file(rng: random.Random, chars: int, facts: list[str]) -> str:
    lines = ['"""Service helpers."""', "", "import logging", "import time", "", "log = logging.getLogger(__name__)"]
    while sum(len(x) + 1 for x in lines) < chars:
        name, arg = _ident(rng), rng.choice(WORDS)
        if rng.random() < 0.3:
            lines += ["", "", f"class {name.title().replace('_', '')}:", f'    """Keeps the {arg} state per tenant."""',
                      "", f"    def __init__(self, {arg}_limit: int = {rng.randint(2, 512)}) -> None:",
                      f"        self.{arg}_limit = {arg}_limit", f"        self._{arg}s: dict[str, int] = {{}}"]
        else:
            lines += ["", "", f"def {name}({arg}, retries={rng.randint(1, 9)}, timeout={rng.randint(1, 90)}):",
                      f'    """Hand the {arg} to the {rng.choice(WORDS)} and wait at most `timeout` seconds."""',
                      "    for attempt in range(retries):",
                      f"        result = dispatch({arg}, '{name}/{rng.randint(1, 99)}', timeout=timeout)",
                      "        if result is not None:", "            return result",
                      f"        log.warning('{name}: attempt %d failed', attempt)",
                      f"        time.sleep({rng.choice(['0.1', '0.5', '1.0'])} * 2 ** attempt)", "    return None"]
        if facts and rng.random() < 0.3:
            lines.append(f"# NOTE: {facts.pop()}")
    return "\n".join(lines + [f"# NOTE: {f}" for f in facts])


def _typescript_file(rng: random.Random, chars: int, facts: list[str]) -> str:
    lines = ["import { useEffect, useState } from 'react';", "import { api } from './api';"]
    while sum(len(x) + 1 for x in lines) < chars:
        name, field_name = _ident(rng), rng.choice(WORDS)
        camel = name.split("_")[0] + name.split("_")[1].title()
        if rng.random() < 0.4:
            lines += ["", f"export interface {camel.title()}Props {{", f"  {field_name}Id: string;",
                      f"  limit?: number; // defaults to {rng.randint(5, 200)}", f"  on{field_name.title()}?: "
                      f"(value: string) => void;", "}"]
        else:
            lines += ["", f"export async function {camel}(id: string, limit = {rng.randint(5, 200)}): "
                      "Promise<string[]> {",
                      f"  const response = await api.get(`/{field_name}/${{id}}?limit=${{limit}}`);",
                      "  if (!response.ok) {", f"    throw new Error(`{camel} failed: ${{response.status}}`);", "  }",
                      f"  return response.data.items.map((item: {{ {field_name}: string }}) => item.{field_name});",
                      "}"]
        if facts and rng.random() < 0.3:
            lines.append(f"// NOTE: {facts.pop()}")
    return "\n".join(lines + [f"// NOTE: {f}" for f in facts])


def _yaml_file(rng: random.Random, chars: int, facts: list[str]) -> str:
    lines = ["apiVersion: apps/v1", "kind: Deployment", "services:"]
    while sum(len(x) + 1 for x in lines) < chars:
        name = _ident(rng)
        lines += [f"  {name}:", f"    image: registry.local/{name}:{rng.randint(1, 40)}.{rng.randint(0, 9)}",
                  f"    replicas: {rng.randint(1, 12)}", f"    port: {rng.randint(3000, 9999)}", "    env:",
                  f"      {rng.choice(WORDS).upper()}_LIMIT: \"{rng.randint(1, 10000)}\"",
                  f"      LOG_LEVEL: {rng.choice(['info', 'debug', 'warn'])}"]
        if facts and rng.random() < 0.3:
            lines.append(f"  # {facts.pop()}")
    return "\n".join(lines + [f"# {f}" for f in facts])


def _markdown_file(rng: random.Random, chars: int, facts: list[str]) -> str:
    lines = [f"# Design notes: the {rng.choice(WORDS)} service", ""]
    while sum(len(x) + 1 for x in lines) < chars:
        a, b = rng.sample(WORDS, 2)
        lines += [f"## {a.title()} and {b}", "",
                  f"The {a} layer hands each request to the {b} pool; when the pool is "
                  f"{rng.choice(['full', 'cold', 'draining'])} "
                  f"it waits up to {rng.randint(2, 60)} seconds and then returns a 503. We chose this over a queue "
                  f"because the {rng.choice(WORDS)} team measured {rng.randint(2, 40)}% fewer timeouts.", "",
                  f"- keep the {a} stateless", f"- log every {b} rejection with its tenant id", ""]
        if facts and rng.random() < 0.3:
            lines += [facts.pop(), ""]
    return "\n".join(lines + facts)


def _log_file(rng: random.Random, chars: int, facts: list[str]) -> str:
    text = log_lines(rng, max(4, chars // 80))
    lines = text.split("\n")
    for fact in facts:
        lines.insert(rng.randrange(len(lines) + 1), f"2026-11-14T09:00:00Z INFO  [ops] note: {fact}")
    return "\n".join(lines)


def _trace(rng: random.Random) -> str:
    frames = []
    for _ in range(rng.randint(6, 14)):
        name = _ident(rng)
        frames += [f'  File "/srv/app/{rng.choice(WORDS)}/{name}.py", line {rng.randint(10, 900)}, in {name}',
                   f"    return {rng.choice(WORDS)}.{name}({rng.choice(WORDS)}, timeout={rng.randint(1, 60)})"]
    error = rng.choice(["KeyError: 'tenant_id'", "TimeoutError: upstream did not answer in 30 s",
                        "ValueError: invalid literal for int() with base 10: ''",
                        "sqlite3.OperationalError: database is locked"])
    return "Traceback (most recent call last):\n" + "\n".join(frames) + f"\n{error}"


FILE_KINDS = (("py", _python_file), ("ts", _typescript_file), ("yaml", _yaml_file), ("md", _markdown_file),
              ("log", _log_file))


def make_long_session(seed: int = 0, target_tokens: int = 32768) -> LongSession:
    """Turns until the estimate reaches `target_tokens`: files (1-3K tokens) and chat first carry the facts, the
    middle mixes every kind, the last quarter adds the probes between ordinary turns."""
    rng = random.Random(seed * 104729 + 27)
    used: set[str] = set()
    n_facts = 6 if target_tokens >= 16384 else 4
    facts = [make_fact(FACT_TYPES[i % len(FACT_TYPES)], rng.randrange(5), rng, used) for i in range(n_facts)]
    in_chat = {0, 3} if n_facts > 4 else {0}
    turns: list[LongTurn] = []
    files: list[tuple[str, str, bool]] = []        # name, body, holds a fact
    functions: list[str] = []
    kind_counter = 0

    def add(kind: str, text: str, attachments=(), fact: Fact | None = None, planted=()) -> None:
        turns.append(LongTurn(len(turns), kind, text, REPLY_TOKENS[kind], list(attachments), fact, list(planted)))

    def attach(planted: list[Fact]) -> None:
        nonlocal kind_counter
        ext, make = FILE_KINDS[kind_counter % len(FILE_KINDS)]
        kind_counter += 1
        tokens = rng.randint(1000, 3000) if target_tokens >= 8192 else rng.randint(300, 700)
        name = f"{rng.choice(['src', 'lib', 'web', 'ops', 'docs'])}/{_ident(rng)}.{ext}"
        body = make(rng, int(tokens * CHARS_PER_TOKEN), [f.statement for f in planted])
        for fact in planted:
            fact.where = f"file:{name}"
        files.append((name, body, bool(planted)))
        functions.extend(x.split("(")[0][4:] for x in body.split("\n") if x.startswith("def "))
        add("attach", f"Here is {name} from my project. Read it and reply OK.", [(name, body)],
            planted=[f.value for f in planted])

    def ordinary(total: int) -> None:
        roll = rng.random()
        target = rng.choice(functions) if functions else _ident(rng)
        if roll < 0.30:
            add("short", rng.choice(QUESTIONS).format(f=target))
        elif roll < 0.50:
            add("code", rng.choice(CODE_ASKS).format(f=target))
        elif roll < 0.58:
            add("short", rng.choice(SHORT_FILLERS))
        elif roll < 0.64:
            add("code", rng.choice(CODE_FILLERS))
        elif roll < 0.74:
            add("log", "This showed up in production last night, what went wrong?\n\n"
                + log_lines(rng, rng.randint(12, 40)))
        elif roll < 0.82:
            add("trace", f"I get this stack trace when I call {target}:\n\n{_trace(rng)}")
        elif roll < 0.86 and any(not holds for _, _, holds in files):
            name, body = rng.choice([(n, b) for n, b, holds in files if not holds])
            add("reupload", f"I changed nothing in {name}, but here it is again. Reply OK.", [(name, body)])
        elif total < target_tokens * 0.7:
            attach([])
        else:
            add("short", rng.choice(QUESTIONS).format(f=target))

    # Early: the facts, in files and in chat, with ordinary turns between.
    for i, fact in enumerate(facts):
        if i in in_chat:
            fact.where = "chat"
            add("chat_fact", f"Also, for the record: {fact.statement} Just say noted.", planted=[fact.value])
        else:
            attach([fact])
        ordinary(sum(t.estimated_tokens for t in turns))
    # Middle: every kind until three quarters of the target, then the probes among ordinary turns.
    while sum(t.estimated_tokens for t in turns) < target_tokens * 0.75:
        ordinary(sum(t.estimated_tokens for t in turns))
    probed = list(facts)
    rng.shuffle(probed)
    pending = list(probed)
    while sum(t.estimated_tokens for t in turns) < target_tokens or pending:
        if pending and rng.random() < 0.4:
            fact = pending.pop()
            add("probe", f"{fact.question} {INSTRUCTION[fact.kind]}", fact=fact)
        else:
            ordinary(sum(t.estimated_tokens for t in turns))
    for _ in range(3):                            # the session ends on comparable turns (the flatness window)
        add("short", rng.choice(QUESTIONS).format(f=rng.choice(functions) if functions else _ident(rng)))
    return LongSession(seed=seed, target_tokens=target_tokens, turns=turns, facts=facts, probed=probed)
