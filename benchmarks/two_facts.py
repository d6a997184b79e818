"""The two-facts workload: two attached files, each hiding one numeric fact among look-alike lines,
coding-chat fillers between, then one probe per fact.

Invariants: a session is a pure function of its seed (no model, no engine); the two facts differ in
subject and value, and no other line of the session contains a fact's value, so a block that holds
the value holds the fact; the file styles, fact frames and fillers share no text with `bench recall`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# A fact frame: how the fact is written in a file and how the probe asks for it. Subjects are drawn
# per session, so the same frame asks about different things in different sessions.
FRAMES = [
    ("The door code for the {s} is {v}.", "What is the door code for the {s}? Answer with the number."),
    ("The {s} service listens on port {v}.", "Which port does the {s} service listen on? Answer with the number."),
    ("Invoice {v} was raised for the {s} contract.", "What is the invoice number of the {s} contract? "
                                                     "Answer with the number."),
    ("The {s} cluster was rebooted at build {v}.", "At which build was the {s} cluster rebooted? "
                                                   "Answer with the number."),
    ("Locker {v} belongs to the {s} team.", "Which locker belongs to the {s} team? Answer with the number."),
    ("The {s} budget line is account {v}.", "What is the account of the {s} budget line? Answer with the number."),
]
SUBJECTS = ["north wing", "billing", "archive", "staging", "warehouse", "research", "payroll", "search",
            "mobile", "analytics", "support", "design", "security", "logistics", "frontend", "mailroom"]
FILE_NAMES = ["handover.md", "ops-notes.txt", "standup-week-41.md", "inventory.txt", "runbook.md",
              "facilities.txt", "migration-plan.md", "oncall-log.txt"]
NAMES = ["Priya", "Tomas", "Mei", "Olu", "Sven", "Ines", "Kenji", "Lara", "Noor", "Rafael"]
_LOG_ACTIONS = ["restarted the worker", "rotated the logs", "closed the alert", "merged the fix",
                "paused the queue", "updated the dashboard", "resized the disk"]
_TASKS = ["onboarding flow", "retry policy", "export screen", "quota page", "search ranking", "audit trail"]
_ITEMS = ["cables", "adapters", "keyboards", "monitors", "headsets", "docks"]


def _log_line(r: random.Random) -> str:
    return (f"{r.randint(7, 19):02d}:{r.randint(0, 59):02d} {r.choice(NAMES)} {r.choice(_LOG_ACTIONS)} "
            f"on {r.choice(['node', 'host', 'runner'])}-{r.randint(1, 60)}.")


def _minutes_line(r: random.Random) -> str:
    verb = r.choice(["review", "draft", "test", "document", "estimate"])
    return f"- {r.choice(NAMES)} will {verb} the {r.choice(_TASKS)} by {r.choice(['Monday', 'Friday', 'next week'])}."


def _inventory_line(r: random.Random) -> str:
    return (f"Shelf {r.choice('ABCDEFGH')}{r.randint(1, 9)}: {r.randint(2, 48)} {r.choice(_ITEMS)}, "
            f"{r.choice(['checked', 'recounted', 'labelled', 'moved'])} by {r.choice(NAMES)}.")


STYLES = {"log": _log_line, "minutes": _minutes_line, "inventory": _inventory_line}
FILLERS = ["What does HTTP status 404 mean?", "Name one Python keyword.", "What is a git branch?",
           "What does JSON stand for?", "Give one reason to write unit tests.", "What is a race condition?",
           "What does the ls command do?", "Name a sorting algorithm.", "What is an API?",
           "What is the difference between a list and a tuple?", "What does CPU stand for?",
           "Why do we use version control?"]
SYSTEM = "You are a helpful coding assistant."


@dataclass(frozen=True)
class Fact:
    sentence: str
    question: str
    value: str
    file: str


@dataclass(frozen=True)
class TwoFactSession:
    seed: int
    files: list[tuple[str, str]]       # (name, text), attached in this order in the first two turns
    fillers: list[str]
    facts: list[Fact]                  # probed in this order at the end


def _value(rng: random.Random, used: set[str]) -> str:
    while True:
        value = str(rng.randint(10000, 99999))      # five digits: no filler line has a five-digit number
        if value not in used:
            used.add(value)
            return value


def _file(rng: random.Random, fact_sentence: str) -> str:
    style = STYLES[rng.choice(sorted(STYLES))]
    lines = [style(rng) for _ in range(rng.randint(18, 30))]
    lines.insert(rng.randrange(len(lines) + 1), fact_sentence)
    return "\n".join(lines)


def make_session(seed: int, *, fillers: int = 5) -> TwoFactSession:
    rng = random.Random(f"two-facts-{seed}")
    frames = rng.sample(FRAMES, 2)
    subjects = rng.sample(SUBJECTS, 2)
    names = rng.sample(FILE_NAMES, 2)
    used: set[str] = set()
    facts, files = [], []
    for (statement, ask), subject, name in zip(frames, subjects, names, strict=True):
        value = _value(rng, used)
        sentence = statement.format(s=subject, v=value)
        facts.append(Fact(sentence, ask.format(s=subject), value, name))
        files.append((name, _file(rng, sentence)))
    rng.shuffle(facts)
    return TwoFactSession(seed, files, rng.sample(FILLERS, fillers), facts)


def passed(reply: str, fact: Fact) -> bool:
    return fact.value in re.findall(r"\d+", reply)
