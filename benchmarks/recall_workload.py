"""The recall suite's sessions, generated from templates and a seed: facts, files, fillers, probes.

Invariants: a session is a pure function of its seed (no model, no engine); every fact value is
unique in its session (decoys and fillers never repeat it), so a block holding the value holds
the fact; a probe's question is drawn from wordings that avoid the fact sentence's key words.
This module is the suite's generator only: nothing in the engine reads it or is tuned on it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

FACT_TYPES = ("name", "quantity", "identifier", "config", "path", "date")

# One frame: how a fact is stated (several wordings), how it is asked (paraphrases that share few
# words with the statements) and the instruction that says what kind of answer is wanted.
FRAMES: dict[str, list[dict]] = {
    "name": [
        {"facts": ["The on-call engineer for the payments service this week is {v}.",
                   "{v} carries the pager for the payments service this week."],
         "asks": ["Who should I phone if billing breaks in the next few days?",
                  "Which colleague is responsible when checkout goes down right now?"]},
        {"facts": ["The release manager for version 4 is {v}.", "Version 4 ships under the supervision of {v}."],
         "asks": ["Who is in charge of getting the v4 build out the door?",
                  "Which person coordinates the next major launch?"]},
        {"facts": ["Our database administrator is {v}.", "{v} looks after the Postgres cluster."],
         "asks": ["Which teammate maintains the DB servers?", "Who keeps our SQL machines healthy?"]},
        {"facts": ["The security review was signed off by {v}.", "{v} approved the security audit last month."],
         "asks": ["Whose signature is on the vulnerability assessment?",
                  "Which reviewer gave the go-ahead on the pentest findings?"]},
        {"facts": ["The mobile app was designed by {v}.", "{v} drew every screen of the phone app."],
         "asks": ["Who created the look of our iOS and Android client?",
                  "Which designer is behind the handset interface?"]},
    ],
    "quantity": [
        {"facts": ["The upload limit for attachments is {v} MB.", "Attachments larger than {v} MB are refused."],
         "asks": ["How big may a file be before the server rejects it?",
                  "What is the maximum size someone can send as an enclosure?"]},
        {"facts": ["Requests time out after {v} seconds.", "A request is abandoned once {v} seconds pass."],
         "asks": ["How long does a call wait before giving up?", "After what delay does the client stop waiting?"]},
        {"facts": ["The cache keeps entries for {v} minutes.",
                   "Cached items expire {v} minutes after they are written."],
         "asks": ["What is the lifetime of stored lookups before they go stale?",
                  "For how long is a memoized result kept around?"]},
        {"facts": ["The build machine has {v} GB of memory.", "Our CI runner comes with {v} GB of RAM."],
         "asks": ["How much working storage does the continuous integration box have?",
                  "What amount of main memory is installed in the test server?"]},
        {"facts": ["The nightly job processes about {v} orders per batch.",
                   "Each overnight batch handles roughly {v} orders."],
         "asks": ["How many purchases go through in one run after midnight?",
                  "What volume of sales does a single night-time chunk contain?"]},
    ],
    "identifier": [
        {"facts": ["The function that validates user tokens is called {v}.",
                   "User tokens are validated in the function {v}."],
         "asks": ["What is the routine that checks auth credentials named?",
                  "Which helper verifies a login secret?"]},
        {"facts": ["Retries are handled by the class {v}.", "The class {v} repeats failed calls."],
         "asks": ["Which type re-attempts operations that did not succeed?",
                  "What object is responsible for trying again after an error?"]},
        {"facts": ["The entry point of the importer is {v}.", "The importer starts running in {v}."],
         "asks": ["Where does the ingestion tool begin executing?", "Which callable kicks off loading the data?"]},
        {"facts": ["Invoices are rendered to PDF by the method {v}.", "The method {v} turns an invoice into a PDF."],
         "asks": ["Which piece of code produces printable bills?",
                  "What produces the document customers get charged with?"]},
        {"facts": ["The metrics exporter lives in the module {v}.", "The module {v} exports our Prometheus metrics."],
         "asks": ["Which file of the codebase publishes monitoring counters?",
                  "Where is the telemetry for dashboards emitted from?"]},
    ],
    "config": [
        {"facts": ["compression = {v}    # codec used for the event archive",
                   "The archive is compressed with the {v} codec (key: compression)."],
         "asks": ["Which algorithm squeezes the stored event history?",
                  "What packing scheme shrinks old events on disk?"],
         "values": ["zstd", "brotli", "lz4", "snappy", "xz", "lzma"]},
        {"facts": ["region = {v}    # where the primary bucket is hosted",
                   "The primary bucket is hosted in the {v} region (key: region)."],
         "asks": ["In which cloud location does our main storage sit?",
                  "Where geographically is the object store placed?"],
         "values": ["eu-north-1", "ap-southeast-2", "us-east-2", "sa-east-1", "me-central-1"]},
        {"facts": ["log_format = {v}    # layout of every log line",
                   "Every log line is written in the {v} layout (key: log_format)."],
         "asks": ["What shape do the application's diagnostic records take?",
                  "How are the service's trace messages formatted?"],
         "values": ["logfmt", "ndjson", "syslog5424", "gelf", "cef"]},
        {"facts": ["scheduler_backend = {v}    # runs the periodic jobs",
                   "Periodic jobs run on the {v} backend (key: scheduler_backend)."],
         "asks": ["What executes the recurring tasks?", "Which engine drives the cron-like work?"],
         "values": ["apscheduler", "celerybeat", "rq-scheduler", "huey", "dramatiq"]},
        {"facts": ["session_store = {v}    # where login sessions are kept",
                   "Login sessions are kept in {v} (key: session_store)."],
         "asks": ["Which storage holds signed-in users' state?", "Where does the site remember who is authenticated?"],
         "values": ["redis", "memcached", "dynamodb", "cockroachdb", "etcd"]},
    ],
    "path": [
        {"facts": ["The nightly reports are written to {v}.", "Nightly reports land in {v}."],
         "asks": ["Where on disk do the overnight summaries end up?",
                  "In which folder can I find the after-hours digests?"],
         "url": False},
        {"facts": ["The staging API lives at {v}.", "Staging traffic goes to {v}."],
         "asks": ["What is the address of the pre-production endpoint?",
                  "Which URL do we hit for the test environment's service?"],
         "url": True},
        {"facts": ["The TLS certificate is stored at {v}.", "Our HTTPS certificate sits in {v}."],
         "asks": ["Where is the secure-connection key material kept?", "What location holds the SSL cert?"],
         "url": False},
        {"facts": ["The runbook is published at {v}.", "You can read the runbook at {v}."],
         "asks": ["Where do I find the incident handbook?", "What link has the operations guide?"],
         "url": True},
        {"facts": ["Crash dumps are collected in {v}.", "When the service crashes its dumps go to {v}."],
         "asks": ["Where are the core files gathered after a failure?",
                  "Which directory receives post-mortem snapshots?"],
         "url": False},
    ],
    "date": [
        {"facts": ["The contract with the hosting provider expires on {v}.",
                   "Our hosting contract runs until {v}."],
         "asks": ["When does the agreement with our cloud vendor end?",
                  "Until what day are we committed to the datacenter company?"]},
        {"facts": ["The database migration is scheduled for {v}.", "We migrate the database on {v}."],
         "asks": ["On which day do we move the data to the new schema?", "When is the storage switchover planned?"]},
        {"facts": ["Version 3 reaches end of life on {v}.", "Support for version 3 stops on {v}."],
         "asks": ["When will the old major release stop getting fixes?", "What is the last day v3 is maintained?"]},
        {"facts": ["The team offsite takes place on {v}.", "Everyone meets at the offsite on {v}."],
         "asks": ["When is the company retreat?", "On what day do we all gather away from the office?"]},
        {"facts": ["The domain name must be renewed by {v}.", "Our domain registration lapses on {v}."],
         "asks": ["By when do we have to pay for the website address again?",
                  "What is the deadline for extending the site's registration?"]},
    ],
}

INSTRUCTION = {"name": "Answer with the person's name.", "quantity": "Answer with the number.",
               "identifier": "Answer with the exact identifier.", "config": "Answer with the exact value.",
               "path": "Answer with the exact path or URL.", "date": "Answer with the date."}

FIRST = ["Priya", "Tomas", "Aiko", "Marek", "Ngozi", "Sven", "Leila", "Rafael", "Ingrid", "Kwame", "Yusuf",
         "Elena", "Dmitri", "Amara", "Joaquin", "Hana"]
LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Kowalski", "Brennan", "Haddad", "Novak", "Ferreira", "Iyer",
        "Castellano", "Abernathy", "Vasquez", "Holmberg", "Achterberg", "Mbeki", "Quintero", "Szabo"]
ID_PARTS = (["fetch", "resolve", "check", "build", "render", "sync", "flush", "parse", "emit", "guard"],
            ["ledger", "quota", "token", "invoice", "shard", "cursor", "badge", "ticket", "bundle", "lease"],
            ["v2", "fast", "safe", "impl", "core", "ex", "async", "now"])
PATH_ROOTS = ["/var/lib/{a}/{b}", "/srv/{a}/{b}", "/opt/{a}/{b}/out", "https://{a}.example.net/{b}",
              "https://docs.{a}.io/{b}", "/home/deploy/{a}/{b}", "s3://{a}-{b}/daily"]
PATH_WORDS = ["kestrel", "orchid", "basalt", "meridian", "tundra", "quasar", "juniper", "cobalt", "lumen",
              "harbor", "falcon", "saffron", "granite", "nimbus", "vertex", "willow"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]

NOISE = ["The README explains how to run the tests locally.", "We moved the CI pipeline to the new runners.",
         "Please keep pull requests small and focused.", "Dependencies are pinned in the lock file.",
         "The on-boarding notes were updated last sprint.", "Linting runs before every commit.",
         "Feature flags are cleaned up once a quarter.", "We prefer composition over inheritance.",
         "Every service exposes a health endpoint.", "Staging mirrors production as closely as possible.",
         "Code review needs one approval from the owning team.", "Benchmarks live in a separate repository.",
         "The style guide follows the usual conventions.", "Flaky tests are quarantined and tracked.",
         "Alerts are routed to the shared channel.", "Secrets never go into the repository.",
         "The changelog is written by hand.", "Docker images are rebuilt weekly.",
         "Dashboards are reviewed in the Monday meeting.", "Old branches are deleted after merge."]
FILE_KINDS = [("NOTES.md", "# Team notes\n"), ("ops/handbook.txt", "OPERATIONS HANDBOOK\n"),
              ("config/service.ini", "; service configuration and remarks\n"), ("docs/decisions.md", "# Decisions\n")]

SHORT_FILLERS = ["What is the opposite of hot?", "Name a fruit that is yellow.", "How many legs does a spider have?",
                 "What season comes after winter?", "Give one word that rhymes with tree.",
                 "Which planet do we live on?", "What do bees make?", "What is a good name for a cat?",
                 "What colour is grass?", "How many days are in a week?"]
CODE_FILLERS = ["Write a Python function that reverses a singly linked list.",
                "Write a Python function that checks whether a string is a palindrome.",
                "Show me a JavaScript function that debounces another function.",
                "Write a Python class for a simple stack with push, pop and peek.",
                "Write a SQL query that finds the ten most recent orders per customer.",
                "Write a bash script that deletes files older than seven days in a folder.",
                "Write a Python function that merges two sorted lists."]
LOG_LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]
LOG_EVENTS = ["worker started", "heartbeat ok", "connection pool resized", "request served in {n} ms",
              "cache miss for key user:{n}", "retrying upstream call (attempt {k})", "queue depth {n}",
              "gc pause {k} ms", "config reloaded", "slow query took {n} ms", "socket closed by peer"]


@dataclass
class Fact:
    kind: str
    frame: int
    statement: str
    question: str
    value: str                 # the surface string as stated
    answer_tokens: list[str]   # whole tokens a passing reply contains (all of them)
    where: str = ""            # "file:<name>" or "chat"


@dataclass
class Turn:
    kind: str                  # attach | chat_fact | short | code | log | probe
    text: str
    max_tokens: int
    attachments: list[tuple[str, str]] = field(default_factory=list)
    fact: Fact | None = None
    reply: str = ""            # a canned reply (the model-free retrieval bench); empty: the bench picks one


@dataclass
class Session:
    seed: int
    facts: list[Fact]
    probed: list[Fact]
    turns: list[Turn]


def _value(kind: str, frame: dict, rng: random.Random, used: set[str]) -> tuple[str, list[str]]:
    for _ in range(100):
        if kind == "name":
            first, last = rng.choice(FIRST), rng.choice(LAST)
            value, tokens = f"{first} {last}", [last]
        elif kind == "quantity":
            value = str(rng.randint(110, 980))
            tokens = [value]
        elif kind == "identifier":
            a, b, c = (rng.choice(p) for p in ID_PARTS)
            value = rng.choice([f"{a}_{b}_{c}", f"{a.capitalize()}{b.capitalize()}{c.capitalize()}"])
            tokens = [value]
        elif kind == "config":
            value = rng.choice(frame["values"])
            tokens = [value]
        elif kind == "path":
            a, b = rng.sample(PATH_WORDS, 2)
            roots = [r for r in PATH_ROOTS if r.startswith(("https:", "s3:")) == frame["url"]]
            value = rng.choice(roots).format(a=a, b=b)
            tokens = [value]
        else:
            year, month, day = rng.randint(2026, 2029), rng.randrange(12), rng.randint(2, 27)
            if rng.random() < 0.5:
                value, tokens = f"{year}-{month + 1:02d}-{day:02d}", [f"{year}-{month + 1:02d}-{day:02d}"]
            else:
                value, tokens = f"{MONTHS[month]} {day}, {year}", [MONTHS[month], str(day)]
        key = value.split()[-1] if kind == "name" else value
        if key not in used:
            used.add(key)
            return value, tokens
    raise RuntimeError(f"no unique {kind} value")


def make_fact(kind: str, frame_index: int, rng: random.Random, used: set[str]) -> Fact:
    frame = FRAMES[kind][frame_index]
    value, tokens = _value(kind, frame, rng, used)
    return Fact(kind=kind, frame=frame_index, statement=rng.choice(frame["facts"]).format(v=value),
                question=rng.choice(frame["asks"]), value=value, answer_tokens=tokens)


def log_lines(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        event = rng.choice(LOG_EVENTS).format(n=rng.randint(1000, 99999), k=rng.randint(1, 9))
        out.append(f"2026-11-{rng.randint(10, 20):02d}T0{rng.randint(0, 9)}:{rng.randint(10, 59)}:{i % 60:02d}Z "
                   f"{rng.choice(LOG_LEVELS):5s} [{rng.choice(['api', 'worker', 'db', 'auth'])}] {event}")
    return "\n".join(out)


def make_session(seed: int, *, probes: int = 3, probe_offset: int | None = None, decoys: int = 2) -> Session:
    """One session: 2-3 attached files holding the facts (one fact stated in chat instead), fillers, probes.

    Probed types rotate with the seed (`probe_offset`), so consecutive seeds cover every type evenly;
    `decoys` lines per fact state the same type of fact about other subjects (0-4: the difficulty).
    """
    rng = random.Random(seed * 7919 + 17)
    used: set[str] = set()
    facts = [make_fact(kind, rng.randrange(len(FRAMES[kind])), rng, used) for kind in FACT_TYPES]
    offset = (seed * probes) if probe_offset is None else probe_offset
    probed = [facts[(offset + i) % len(FACT_TYPES)] for i in range(probes)]
    chat_fact = probed[seed % probes] if seed % 2 == 0 else rng.choice([f for f in facts if f not in probed])
    chat_fact.where = "chat"

    # Decoys: the same types, other frames, other values (a neighbouring line that looks alike).
    decoy_lines = []
    for fact in facts:
        others = [i for i in range(len(FRAMES[fact.kind])) if i != fact.frame]
        for frame_index in rng.sample(others, decoys):
            decoy_lines.append(make_fact(fact.kind, frame_index, rng, used).statement)

    n_files = rng.choice([2, 3])
    kinds = rng.sample(FILE_KINDS, n_files)
    files: list[tuple[str, list[str]]] = [(name, []) for name, _ in kinds]
    for fact in facts:
        if fact is chat_fact:
            continue
        index = rng.randrange(n_files)
        fact.where = f"file:{files[index][0]}"
        files[index][1].append(fact.statement)
    for line in decoy_lines:
        files[rng.randrange(n_files)][1].append(line)
    attachments = []
    for (name, header), (_, lines) in zip(kinds, files, strict=True):
        body = lines + rng.sample(NOISE, rng.randint(10, 16))
        rng.shuffle(body)
        attachments.append((name, header + "\n".join(body)))

    names = " and ".join(n for n, _ in attachments)
    turns = [Turn("attach", f"Here are some files from my project ({names}). Please read them and reply OK.", 3,
                  attachments=attachments),
             Turn("chat_fact", f"Also, for the record: {chat_fact.statement} Just say noted.", 4)]
    fillers = [Turn("short", q, 40) for q in rng.sample(SHORT_FILLERS, 2)]
    fillers.append(Turn("code", rng.choice(CODE_FILLERS), 160))
    night = log_lines(rng, rng.randint(14, 22))
    fillers.append(Turn("log", "Here is a log from last night, is anything wrong?\n\n" + night, 48))
    rng.shuffle(fillers)
    turns += fillers
    for fact in probed:
        turns.append(Turn("probe", f"{fact.question} {INSTRUCTION[fact.kind]}", 32, fact=fact))
    return Session(seed=seed, facts=facts, probed=probed, turns=turns)


def passed(reply: str, fact: Fact) -> bool:
    """Every answer token appears in the reply as a whole token (ordinals like 14th count as 14)."""
    text = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", reply)
    for token in fact.answer_tokens:
        pattern = rf"(?<![\w/.-]){re.escape(token)}(?![\w/-])"
        if re.search(pattern, text, flags=re.IGNORECASE) is None:
            return False
    return True


def fact_words(fact: Fact) -> set[str]:
    return set(re.findall(r"[a-z]+", fact.statement.lower()))


def overlap(fact: Fact) -> float:
    """Share of the question's content words that appear in the statement (the suite keeps it low)."""
    stop = {"the", "a", "an", "of", "in", "is", "what", "which", "who", "where", "when", "do", "does", "to", "for",
            "our", "we", "i", "on", "at", "by", "how", "it", "its", "are", "be", "can", "after", "before", "with"}
    asked = set(re.findall(r"[a-z]+", fact.question.lower())) - stop
    return len(asked & fact_words(fact)) / max(1, len(asked))
