"""A third retrieval workload, written after the defaults were fixed (2026-11-26) and run once on them: a longer
working day with other file kinds (SQL, Dockerfile, Makefile, Go, nginx, Kubernetes, .env) and facts that arrive
over the day, each asked a few turns after it came, in other words again. Nothing was tuned on it.

Invariants: a session is a pure function of its seed; every fact value is unique in its session (the look-alike
line of each type carries another value); `Fact.statement` is the exact line as it appears in the file or
message; a probe comes at least three turns after its fact; every turn carries its canned reply.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from .recall_workload import Fact, Session, Turn
from .retrieval_workload import file_with

FACT_TYPES = ("sql", "container", "build", "go", "proxy", "cluster", "env", "chat")

# type -> frames: (line with {v}, file kind, questions that avoid the line's words, value maker)
FRAMES: dict[str, list[tuple[str, str, list[str], str]]] = {
    "sql": [
        ("ALTER TABLE orders ADD COLUMN discount_cents INTEGER NOT NULL DEFAULT {v};", "sql",
         ["When a purchase row is inserted with no markdown amount, what number ends up stored?",
          "What does the migration put in new purchases' price-reduction field by default?"], "num"),
        ("CREATE INDEX idx_events_lookup ON events ({v});", "sql",
         ["Which field of the activity log is the new b-tree keyed on?",
          "What column did we add a lookup structure for in the audit trail?"], "column"),
    ],
    "container": [
        ("EXPOSE {v}", "docker", ["On which port does the image listen once it runs?",
                                  "What socket number should I map when I start that container?"], "port"),
        ("ENV GUNICORN_WORKERS={v}", "docker", ["How many server processes does the image start?",
                                                "With what degree of parallelism does the web app boot in docker?"],
         "small"),
    ],
    "build": [
        ("COVERAGE_MIN := {v}", "make", ["Below which test percentage does CI refuse a change?",
                                         "What share of lines must the suite exercise for the build to pass?"],
         "pct"),
        ("GO_VERSION ?= {v}", "make", ["Which toolchain release do our builds pin?",
                                         "What compiler version does the build file assume for the backend?"],
         "minor"),
    ],
    "go": [
        ("const flushInterval = {v} * time.Millisecond", "go",
         ["How often does the exporter push out what it has buffered?",
          "Every how many ms are pending metrics written out by the Go side?"], "num"),
        ("func NewLimiter(burst int) *Limiter {{ return &Limiter{{rate: {v}, burst: burst}} }}", "go",
         ["What refill speed does a freshly made throttle get?",
          "At what pace does a newly constructed rate guard admit requests?"], "num"),
    ],
    "proxy": [
        ("client_max_body_size {v}m;", "nginx", ["What is the largest request payload the front server lets through?",
                                                  "How big may an upload be before the gateway rejects it?"], "small"),
        ("proxy_read_timeout {v}s;", "nginx", ["How long does the edge wait on a slow backend answer?",
                                               "After how many seconds does the reverse proxy give up on upstream?"],
         "num"),
    ],
    "cluster": [
        ("  replicas: {v}", "k8s", ["How many copies of the API pod are running?",
                                    "What is the instance count of that deployment?"], "small"),
        ('      memory: "{v}Mi"', "k8s", ["How much RAM is each pod capped at?",
                                          "What is the container's memory ceiling in the manifest?"], "num"),
    ],
    "env": [
        ("STRIPE_WEBHOOK_TOLERANCE_SECONDS={v}", "env",
         ["How much clock skew do we accept on payment provider callbacks?",
          "What leeway is allowed on the signed timestamps of card notifications?"], "num"),
        ("SENTRY_SAMPLE_RATE={v}", "env", ["What fraction of errors do we ship to the crash tracker?",
                                           "How much of the exception traffic gets reported upstream?"], "rate"),
    ],
    "chat": [
        ("btw the staging database password rotates every {v} days now", "chat",
         ["How often do the credentials for the pre-prod DB change?",
          "On what schedule are the test environment's login secrets replaced?"], "small"),
        ("Heads up: {v} is on call this week, page them if prod breaks.", "chat",
         ["Who should I contact if production goes down tonight?",
          "Which teammate holds the pager at the moment?"], "person"),
    ],
}

ASK = ["Quick one:", "Remind me:", "Sorry, I forgot:", "Before I merge:", ""]
TAIL = ["Just the value.", "Short answer please.", "One word or number is fine.", ""]

PEOPLE = ["Priya Raman", "Jonas Weber", "Aiko Tanaka", "Mateo Silva", "Fatima Zahra", "Erik Nilsen", "Chen Wei"]
COLUMNS = ["actor_id", "occurred_at", "tenant_key", "event_kind", "request_hash"]


VALUES: dict[str, Callable[[random.Random], str]] = {
    "num": lambda rng: str(rng.randint(120, 9800)),
    "small": lambda rng: str(rng.randint(3, 64)),
    "port": lambda rng: str(rng.randint(3001, 9899)),
    "pct": lambda rng: str(rng.randint(61, 97)),
    "minor": lambda rng: f"1.{rng.randint(19, 24)}",
    "rate": lambda rng: f"0.{rng.randint(11, 89)}",
    "column": lambda rng: rng.choice(COLUMNS),
    "person": lambda rng: rng.choice(PEOPLE),
}


FILLER = {
    "sql": ["-- 0042_orders_cleanup.sql", "BEGIN;", "UPDATE orders SET status = 'archived' WHERE closed_at < now() - "
            "interval '2 years';", "DELETE FROM carts WHERE updated_at < now() - interval '30 days';",
            "CREATE TABLE IF NOT EXISTS refunds (id BIGSERIAL PRIMARY KEY, order_id BIGINT REFERENCES orders(id));",
            "COMMIT;"],
    "docker": ["FROM python:3.12-slim", "WORKDIR /srv", "COPY requirements.txt .",
               "RUN pip install --no-cache-dir -r requirements.txt", "COPY . .", "USER app",
               'CMD ["gunicorn", "shop.wsgi"]'],
    "make": [".PHONY: test lint build", "", "test:", "\tpytest -q --cov=shop --cov-fail-under=$(COVERAGE_MIN)", "",
             "lint:", "\truff check .", "", "build:", "\tdocker build -t shop:latest ."],
    "go": ["package metrics", "", "import (", '\t"sync"', '\t"time"', ")", "", "type Buffer struct {",
           "\tmu    sync.Mutex", "\titems []Sample", "}", "", "func (b *Buffer) Add(s Sample) {", "\tb.mu.Lock()",
           "\tdefer b.mu.Unlock()", "\tb.items = append(b.items, s)", "}"],
    "nginx": ["server {", "    listen 443 ssl;", "    server_name shop.example.com;", "    location / {",
              "        proxy_pass http://app:8000;", "        proxy_set_header Host $host;", "    }", "}"],
    "k8s": ["apiVersion: apps/v1", "kind: Deployment", "metadata:", "  name: shop-api", "spec:",
            "  selector:", "    matchLabels: {app: shop-api}", "  template:", "    spec:", "      containers:",
            "      - name: api", "        image: shop:latest", "        resources:", "          limits:",
            '            cpu: "500m"'],
    "env": ["DATABASE_URL=postgres://shop@db/shop", "REDIS_URL=redis://cache:6379/0", "DJANGO_DEBUG=false",
            "ALLOWED_HOSTS=shop.example.com", "EMAIL_BACKEND=smtp"],
}
FILE_NAMES = {"sql": ["migrations/0042_orders.sql", "db/schema.sql"], "docker": ["Dockerfile", "docker/api.Dockerfile"],
              "make": ["Makefile"], "go": ["metrics/buffer.go", "internal/limit/limiter.go"],
              "nginx": ["deploy/nginx.conf"], "k8s": ["k8s/api-deployment.yaml"], "env": [".env.production"]}

FILLER_TURNS = [
    ("Why does my Django view return 403 on POST but GET works?", 90,
     "That is almost always CSRF: Django rejects a POST without a valid token. In a form add `{% csrf_token %}`; from "
     "JavaScript send the `X-CSRFToken` header read from the cookie. Exempting the view works but gives up the "
     "protection, so keep that for webhooks that authenticate another way."),
    ("What's a good way to paginate a big Postgres table?", 110,
     "Keyset pagination: remember the last row's sort key and ask for `WHERE (created_at, id) > ($1, $2) ORDER BY "
     "created_at, id LIMIT 50`. Unlike OFFSET it does not read and throw away every earlier row, so page 1000 costs "
     "the same as page 1, and rows inserted meanwhile do not shift what the reader sees."),
    ("Can you write a Python function that retries a call with exponential backoff?", 160,
     "```python\nimport random\nimport time\n\n\ndef retry(fn, attempts=5, base=0.2):\n    for i in range(attempts):\n"
     "        try:\n            return fn()\n        except Exception:\n            if i == attempts - 1:\n"
     "                raise\n            time.sleep(base * 2 ** i * (1 + random.random()))\n```\n\nThe jitter keeps "
     "many clients from retrying in lockstep; catch a narrower exception than `Exception` in real code."),
    ("How do I see which process holds a port on Linux?", 60,
     "`ss -ltnp 'sport = :8080'` lists the listening socket with the owning process; `lsof -i :8080` does the same. "
     "Run either with sudo to see processes of other users."),
    ("Explain Go's context cancellation in two sentences.", 70,
     "A context carries a deadline or a cancel signal down the call tree; every blocking call that takes it returns "
     "early once it is done. The function that creates it with `WithCancel` or `WithTimeout` must call the returned "
     "cancel to free its resources."),
    ("Is it worth switching our CI from pip to uv?", 90,
     "Usually yes for CI: uv resolves and installs several times faster and caches wheels well, so cold builds shrink "
     "from minutes to seconds. Keep the lock file as the source of truth and pin uv's version so a new release does "
     "not change resolution under you."),
    ("Review this SQL: SELECT * FROM orders WHERE lower(email) = $1", 80,
     "The `lower()` call keeps a plain index on email from being used, so it scans. Add an expression index on "
     "`lower(email)` or store emails normalized; also list the columns you need instead of `*`."),
    ("What does `set -euo pipefail` do in bash?", 70,
     "`-e` exits on the first failing command, `-u` treats unset variables as errors and `-o pipefail` makes a "
     "pipeline fail when any stage fails, not only the last. Together they stop a script from carrying on after "
     "something broke silently."),
]
ACKS = ["Thanks, got it.", "OK, I read through it.", "Noted, I'll keep that in mind.", "Looks fine to me."]
PROBE_REPLIES = ["Let me look back at what you shared.", "I'd need to check the earlier files."]
ATTACH_TEXTS = ["Here's more of the repo.", "Adding these files for context.", "Some config from the project:"]


@dataclass(frozen=True)
class DayScript:
    """The words of one working-day workload; `make_day_session` turns a script and a seed into a session.

    frames: type -> (line with {v}, file kind or "chat", questions that avoid the line's words, value maker);
    the first frame of a type drawn in a session is its fact, the other its look-alike."""

    fact_types: tuple[str, ...]
    frames: dict[str, list[tuple[str, str, list[str], str]]]
    values: dict[str, Callable[[random.Random], str]]
    filler_lines: dict[str, list[str]]          # file kind -> the file's own lines
    file_names: dict[str, list[str]]
    filler_turns: list[tuple[str, int, str]]    # (message, reply tokens, reply)
    asks: list[str]
    tails: list[str]
    acks: list[str]
    probe_replies: list[str]
    attach_texts: list[str]
    salt: tuple[int, int]                       # the session rng is seeded with seed * salt[0] + salt[1]

    def filler_numbers(self) -> frozenset[str]:
        """Numbers standing in fillers, which no fact value may repeat (`30 days`, `:8080`)."""
        text = "\n".join([*(line for lines in self.filler_lines.values() for line in lines),
                          *(message + reply for message, _, reply in self.filler_turns)])
        return frozenset(re.findall(r"\d+", text) + re.findall(r"\d+\.\d+", text))

    def value(self, maker: str, rng: random.Random, used: set[str]) -> str:
        for _ in range(200):
            value = self.values[maker](rng)
            if value not in used:
                used.add(value)
                return value
        raise RuntimeError(f"no unique {maker} value")


def make_day_session(seed: int, script: DayScript, *, probes: int = 4) -> Session:
    """A working day: facts of every type arrive in files (two or three to a message) and in chat, between
    fillers; `probes` facts (their types rotate with the seed) are asked in the order they came, each at least
    three turns after it, with fillers between probes."""
    rng = random.Random(seed * script.salt[0] + script.salt[1])
    used = set(script.filler_numbers())      # a value never also stands in a filler
    facts: list[Fact] = []
    lines_by_kind: dict[str, list[str]] = {}
    chat_lines: list[str] = []
    for kind in script.fact_types:
        frames = script.frames[kind]
        order = rng.sample(range(len(frames)), len(frames))
        for rank, index in enumerate(order):                 # the fact, then its look-alike
            line, file_kind, asks, maker = frames[index]
            value = script.value(maker, rng, used)
            text = line.format(v=value)
            (chat_lines if file_kind == "chat" else lines_by_kind.setdefault(file_kind, [])).append(text)
            if rank == 0:
                facts.append(Fact(kind=kind, frame=index, statement=text, question=rng.choice(asks), value=value,
                                  answer_tokens=[value], where="chat" if file_kind == "chat" else f"file:{file_kind}"))
    files = [(rng.choice(script.file_names[kind]), file_with(script.filler_lines[kind], lines, rng))
             for kind, lines in lines_by_kind.items()]
    rng.shuffle(files)
    pool = rng.sample(script.filler_turns, len(script.filler_turns))

    def filler() -> Turn:                    # each filler once, then again in another order (people repeat)
        if not pool:
            pool.extend(rng.sample(script.filler_turns, len(script.filler_turns)))
        text, tokens, reply = pool.pop()
        return Turn("filler", text, tokens, reply=reply)

    # the day's first half: files two or three at a time, the chat lines, fillers between
    arrivals: list[Turn] = []
    while files:
        count = rng.choice((2, 3))
        take, files = files[:count], files[count:]
        arrivals.append(Turn("attach", rng.choice(script.attach_texts), 16, attachments=take,
                             reply=rng.choice(script.acks)))
    for line in chat_lines:
        arrivals.insert(rng.randint(1, len(arrivals)), Turn("chat_fact", line, 12, reply=rng.choice(script.acks)))
    turns: list[Turn] = []
    for arrival in arrivals:
        turns.append(arrival)
        if rng.random() < 0.6:
            turns.append(filler())
    stated_at = {}
    for at, turn in enumerate(turns):
        body = turn.text + "".join(text for _, text in turn.attachments)
        for fact in facts:
            if fact.statement in body and id(fact) not in stated_at:
                stated_at[id(fact)] = at
    asked = [facts[(seed * probes + i) % len(facts)] for i in range(min(probes, len(facts)))]   # types rotate
    asked.sort(key=lambda fact: stated_at[id(fact)])
    for fact in asked:                                       # the day's second half: probes between fillers
        while len(turns) - stated_at[id(fact)] < 3 or rng.random() < 0.5:
            turns.append(filler())
        turns.append(Turn("probe", f"{rng.choice(script.asks)} {fact.question} {rng.choice(script.tails)}".strip(),
                          32, fact=fact, reply=rng.choice(script.probe_replies)))
    return Session(seed=seed, facts=facts, probed=[t.fact for t in turns if t.fact], turns=turns)


DAY = DayScript(fact_types=FACT_TYPES, frames=FRAMES, values=VALUES, filler_lines=FILLER, file_names=FILE_NAMES,
                filler_turns=FILLER_TURNS, asks=ASK, tails=TAIL, acks=ACKS, probe_replies=PROBE_REPLIES,
                attach_texts=ATTACH_TEXTS, salt=(7919, 11))


def make_session(seed: int, *, probes: int = 4) -> Session:
    """A session of the day family (`make_day_session` with this module's script)."""
    return make_day_session(seed, DAY, probes=probes)
