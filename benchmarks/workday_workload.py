"""Issue 46's day-long recall workload: a 32K-token coding day with 30 facts planted in the six forms a working day
has them, each asked 2K-25K tokens later in other words than its line. Two scripts of the same shape: `DEV` (levers
are tried on it) and `HELD` (other domains, other wordings; run for the final check only, never tuned on).

Invariants: a session is a pure function of (script, seed); every fact value is unique in its session and no
filler or look-alike repeats it; a fact's `statement` is its exact line as it appears in a file, a message or a
reply; a probe's question shares no content word with the fact's line beyond the form's own framing; probes come
at least 2K (estimated) tokens after their fact; every turn carries its canned reply.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .recall_workload import Fact, Session, Turn

FORMS = ("module_constant", "config_key", "cli_flag", "stack_trace", "chat_decision", "assistant_table")
CHARS_PER_TOKEN = 3.86             # the embedded model's tokenizer on this text (measured); the bench counts real ones
DAY_TOKENS, MIN_GAP, MAX_GAP = 29_000, 2_000, 25_000   # text tokens; with the template the day is ~32K

# form -> frames: (the line with {v}, questions that avoid the line's words, value maker)
Frames = dict[str, list[tuple[str, list[str], str]]]

DEV_FRAMES: Frames = {
    "module_constant": [
        ("RECONNECT_JITTER_MS = {v}", ["How much random spread is added before the socket dials again?",
                                       "What randomisation window do we use when a dropped link is retried?"], "num"),
        ("MAX_UPLOAD_PARTS = {v}", ["Into how many pieces at most can a multipart transfer be split?",
                                    "What is the ceiling on chunks for one big file sent to storage?"], "small"),
        ("SESSION_IDLE_SECONDS = {v}", ["After how long without activity does a login expire?",
                                        "When does an inactive user get signed out automatically?"], "num"),
        ("THUMBNAIL_EDGE_PX = {v}", ["How wide are the preview images we generate?",
                                     "What size do the small picture previews come out at?"], "num"),
        ("LEDGER_BATCH_ROWS = {v}", ["How many entries does the accounting writer commit together?",
                                     "What group size does bookkeeping flush to the database in?"], "num"),
        ("WEBHOOK_MAX_ATTEMPTS = {v}", ["How many times do we try to deliver an outgoing callback?",
                                        "After how many failed notifications do we give up on a subscriber?"],
         "small"),
    ],
    "config_key": [
        ("  max_inflight_batches: {v}", ["How many groups of work can be pending at once in the pipeline?",
                                         "What concurrency cap does the ingestion stage run with?"], "small"),
        ("  retention_days: {v}", ["How long are old metrics kept before deletion?",
                                   "For what period do we store the monitoring history?"], "small"),
        ("pool_size = {v}", ["How many database connections does the app hold open?",
                             "What is the size of the DB link pool in the service settings?"], "small"),
        ("  heartbeat_interval_ms: {v}", ["How often do workers tell the coordinator they are alive?",
                                          "At what rate does a node ping the leader?"], "num"),
        ("shard_count = {v}", ["Across how many partitions is the search index spread?",
                               "Into how many pieces is the lookup index divided?"], "small"),
        ("  queue_visibility_timeout: {v}", ["How long is a taken message hidden from other consumers?",
                                             "For how many seconds does a claimed job stay invisible?"], "num"),
    ],
    "cli_flag": [
        ("python -m trainer --warmup-steps {v} --lr 3e-4 --data ./corpus", [
            "How many ramp-up iterations does my training launch use?",
            "In the fine-tuning command I ran, how long is the initial learning-rate ramp?"], "num"),
        ("pg_dump --jobs {v} --format directory --file backup/ shop", [
            "With how much parallelism did I run the database export?",
            "How many workers did my Postgres backup invocation use?"], "small"),
        ("locust -f load/checkout.py --users {v} --spawn-rate 20 --headless", [
            "How many simulated shoppers did the load test start?",
            "What crowd size did I hammer the purchase flow with?"], "num"),
        ("docker run --memory {v}m --cpus 2 shop-worker:latest", [
            "How much RAM did I give that container when I launched it?",
            "What memory cap was on the worker image in my run command?"], "num"),
        ("pytest -n {v} --maxfail 3 tests/integration", [
            "Across how many processes did I spread the slow test suite?",
            "With what degree of parallelism did the integration tests run?"], "small"),
        ("rsync -az --bwlimit={v} dist/ deploy@edge:/srv/app", [
            "What transfer speed limit did I put on the release copy?",
            "How fast at most was the artifact sync to the edge box allowed to go?"], "num"),
    ],
    "stack_trace": [
        ('  File "billing/ledger.py", line {v}, in reconcile_totals', [
            "At which line did the accounting reconciliation crash?",
            "Where in the bookkeeping code did that exception come from, line-wise?"], "line"),
        ('  File "search/indexer.py", line {v}, in flush_segment', [
            "What line of the indexing code raised in that error I pasted?",
            "Which line number was the search writer on when it failed?"], "line"),
        ("psycopg.errors.DeadlockDetected: deadlock detected on relation {v}", [
            "Which table object id was involved in the lock cycle?",
            "What relation number did Postgres name when the transactions blocked each other?"], "num"),
        ("redis.exceptions.TimeoutError: Timeout reading from cache:{v}", [
            "On which port was the key-value store that timed out?",
            "What port did the slow cache connection go to?"], "port"),
        ('  File "auth/tokens.py", line {v}, in verify_signature', [
            "At what line did the login check blow up?",
            "Where did the credential verification fail, by line number?"], "line"),
        ("OSError: [Errno 24] Too many open files (limit {v})", [
            "What descriptor ceiling did the process hit?",
            "What was the handle limit when the worker ran out?"], "num"),
    ],
    "chat_decision": [
        ("Decision: we cap the export queue at {v} jobs.", [
            "What limit did we settle on for pending exports?",
            "How many report downloads may wait at most, as agreed?"], "num"),
        ("Let's go with {v} for the staging gateway port, it's free on every box.", [
            "Which port did we choose for the pre-production entry point?",
            "Where does the test environment's front door listen, as we agreed?"], "port"),
        ("OK, final call: feature flags expire after {v} days unless renewed.", [
            "How long do toggles live before they lapse?",
            "When do switches we add stop applying, per our rule?"], "small"),
        ("We agreed the p99 budget for checkout is {v} ms.", [
            "What tail latency target did we set for paying?",
            "How slow may the slowest one percent of purchases be?"], "num"),
        ("Fine, the nightly reindex starts at minute {v} past 2am.", [
            "When exactly does the overnight search rebuild kick off?",
            "At what time after two does the index refresh run?"], "minute"),
        ("Agreed: {v} is the owner of the billing migration.", [
            "Who is responsible for moving the invoicing data?",
            "Which teammate leads the accounting schema move?"], "person"),
    ],
    "assistant_table": [
        ("| eu-west | {v} GB |", ["How much disk does the European region need?",
                                  "What storage did you estimate for Europe?"], "num"),
        ("| image-resize | {v} ms |", ["How long does shrinking a picture take, per your table?",
                                       "What was the latency you listed for scaling photos?"], "num"),
        ("| search-api | {v} replicas |", ["How many copies of the lookup service did you suggest?",
                                           "What instance count did you recommend for query serving?"], "small"),
        ("| nightly-backup | {v} min |", ["How long does the overnight dump run, from your summary?",
                                          "What duration did you give for the 3am snapshot?"], "num"),
        ("| kafka-ingest | {v} partitions |", ["How many pieces does the event stream topic have in your plan?",
                                               "What partitioning did you propose for incoming events?"], "small"),
        ("| pdf-render | {v} MB |", ["What memory does document generation take, per your breakdown?",
                                     "How much RAM did you budget for making invoices printable?"], "num"),
    ],
}

HELD_FRAMES: Frames = {
    "module_constant": [
        ("GEOFENCE_RADIUS_M = {v}", ["How close must a courier be to count as arrived?",
                                     "What distance around a drop-off point triggers the arrival event?"], "num"),
        ("OTP_VALID_FOR_S = {v}", ["For how long can a one-time login code be used?",
                                   "When do texted sign-in codes stop working?"], "num"),
        ("CART_HOLD_MINUTES = {v}", ["How long is stock reserved for someone's basket?",
                                     "For how long do we set items aside while a shopper decides?"], "small"),
        ("FRAME_BUDGET_US = {v}", ["How many microseconds may rendering one screen update take?",
                                   "What per-refresh time allowance does the game loop have?"], "num"),
        ("DEDUP_WINDOW_EVENTS = {v}", ["Over how many recent messages do we drop duplicates?",
                                       "How far back does repeated-event suppression look?"], "num"),
        ("MAX_AVATAR_KB = {v}", ["How big can a profile picture be?",
                                 "What is the upper size for user portrait uploads?"], "num"),
    ],
    "config_key": [
        ("  drain_grace_seconds: {v}", ["How long does a node get to finish work before shutdown?",
                                        "What wind-down period do instances have when removed?"], "num"),
        ("sample_rate_hz = {v}", ["How often does the sensor reader poll per second?",
                                  "At what frequency are device measurements taken?"], "num"),
        ("  max_body_kb: {v}", ["How large may an incoming request payload be?",
                                "What is the cap on the size of posted data?"], "num"),
        ("replication_factor = {v}", ["On how many brokers is each record stored?",
                                      "How many copies of every message does the cluster keep?"], "small"),
        ("  cron_jitter_s: {v}", ["By how much do scheduled tasks randomly shift their start?",
                                  "What random delay do periodic jobs get?"], "num"),
        ("tile_cache_mb = {v}", ["How much memory holds map pieces?",
                                 "What RAM do the cartography chunks get?"], "num"),
    ],
    "cli_flag": [
        ("ffmpeg -i in.mov -crf {v} -preset slow out.mp4", [
            "What quality setting did I encode the video with?",
            "Which constant-rate-factor value was in my transcoding command?"], "small"),
        ("terraform apply -parallelism={v} -auto-approve", [
            "How many infrastructure changes did I let run at the same time?",
            "With how much concurrency did I push the cloud resources?"], "small"),
        ("k6 run --vus {v} --duration 10m soak.js", [
            "How many virtual clients did the soak scenario use?",
            "What simulated user count was my endurance test set to?"], "num"),
        ("gunicorn app:wsgi --workers {v} --timeout 60", [
            "How many server processes did I start the web app with?",
            "What worker count was in my launch line for the site?"], "small"),
        ("wrk -t4 -c{v} -d30s http://localhost:8080/", [
            "How many open connections did my benchmark keep?",
            "What connection count did I stress the local server with?"], "num"),
        ("java -Xmx{v}m -jar indexer.jar", [
            "What heap ceiling did I give the JVM tool?",
            "How much maximum memory did the Java indexer get on the command line?"], "num"),
    ],
    "stack_trace": [
        ('  File "routing/planner.py", line {v}, in shortest_leg', [
            "At which line did the path computation crash?",
            "What line of the journey code raised?"], "line"),
        ("sqlite3.OperationalError: database is locked (busy_timeout={v})", [
            "What wait setting was the embedded store using when it refused?",
            "How long did the local DB wait before saying busy?"], "num"),
        ('  File "media/transcode.py", line {v}, in probe_stream', [
            "Which line of the video handling failed?",
            "Where in the encoding helper, line-wise, did it break?"], "line"),
        ("ConnectionRefusedError: [Errno 111] Connect call failed ('10.0.0.5', {v})", [
            "Which port refused the internal connection?",
            "What port number did the private host turn us away on?"], "port"),
        ('  File "sync/merge.py", line {v}, in resolve_conflict', [
            "At what line did the reconciliation of edits crash?",
            "Where did the collaborative editing code fail, by line?"], "line"),
        ("MemoryError: failed to allocate {v} bytes for tensor", [
            "How large was the allocation that ran out of memory?",
            "What byte count did the array request when it failed?"], "num"),
    ],
    "chat_decision": [
        ("Decision: mobile releases freeze {v} hours before a launch.", [
            "How long before going live do we stop shipping phone builds?",
            "What cut-off did we agree for app store submissions?"], "small"),
        ("We settled on {v} as the default page size for the public API.", [
            "How many items per page do external clients get by default?",
            "What listing chunk did we choose for third-party callers?"], "small"),
        ("Final: refunds over {v} euros need a second approver.", [
            "Above what amount does a payback need two people?",
            "From which sum on must another person sign off a return of money?"], "num"),
        ("OK so {v} owns the incident review this sprint.", [
            "Who runs the outage retrospective these two weeks?",
            "Which colleague leads the postmortem now?"], "person"),
        ("Agreed, we keep audit logs for {v} months.", [
            "For how long do we store the compliance trail?",
            "What is our retention for the record of who did what?"], "small"),
        ("Let's use {v} as the canary share for the new router.", [
            "What fraction of traffic goes to the trial version of the proxy?",
            "How much of the load does the early rollout get?"], "rate"),
    ],
    "assistant_table": [
        ("| ap-south | {v} vCPU |", ["How much compute does the Indian region need?",
                                     "What processor count did you estimate for Asia?"], "small"),
        ("| ocr-worker | {v} ms |", ["How long does reading text from a scan take, per your table?",
                                     "What latency did you list for character recognition?"], "num"),
        ("| email-digest | {v} /h |", ["How many summary mails go out hourly, per your numbers?",
                                       "What hourly volume did you give for the newsletter roundup?"], "num"),
        ("| geo-lookup | {v} req/s |", ["What throughput did you plan for place resolution?",
                                        "How many location queries per second did you size for?"], "num"),
        ("| warm-standby | {v} GB |", ["How much storage does the spare database need?",
                                       "What disk did you budget for the failover replica?"], "num"),
        ("| audio-normalize | {v} s |", ["How long does leveling a sound clip take, from your estimate?",
                                         "What duration did you give for volume correction?"], "small"),
    ],
}

PEOPLE = ["Priya Raman", "Jonas Weber", "Aiko Tanaka", "Mateo Silva", "Fatima Zahra", "Erik Nilsen", "Chen Wei",
          "Olga Petrova", "Kwame Mensah", "Lucia Romero"]
VALUES = {"num": lambda rng: str(rng.randint(120, 9800)), "small": lambda rng: str(rng.randint(3, 96)),
          "port": lambda rng: str(rng.randint(3001, 9899)), "line": lambda rng: str(rng.randint(41, 1900)),
          "minute": lambda rng: str(rng.randint(5, 55)), "rate": lambda rng: f"0.{rng.randint(11, 89)}",
          "person": lambda rng: rng.choice(PEOPLE)}

# What the day is made of besides the facts (shared by both scripts: general coding-day text, no fact in it)
NOUNS = ["invoice", "shipment", "tenant", "session", "report", "upload", "account", "order", "webhook", "profile",
         "payment", "catalog", "search", "export", "schedule", "device", "ticket", "coupon", "review", "address"]
VERBS = ["load", "save", "check", "render", "merge", "sync", "parse", "build", "queue", "index"]
CHAT = [
    ("Why does my Django view return 403 on POST but GET works?",
     "That is almost always CSRF: Django rejects a POST without a valid token. Add the token to the form, or send "
     "the X-CSRFToken header from JavaScript; exempt only webhooks that authenticate another way."),
    ("What's a good way to paginate a big Postgres table?",
     "Keyset pagination: remember the last row's sort key and ask for rows after it, ordered, with a limit. Unlike "
     "OFFSET it never reads and throws away the earlier rows, so a deep page costs the same as the first."),
    ("How do I see which process holds a port on Linux?",
     "`ss -ltnp` lists listening sockets with their processes; `lsof -i` does the same. Use sudo to see other "
     "users' processes."),
    ("Explain Go's context cancellation briefly.",
     "A context carries a deadline or cancel signal down the call tree; blocking calls that take it return early "
     "once it is done. Whoever creates it must call the cancel function it got back."),
    ("Is it worth switching CI from pip to uv?",
     "Usually: uv resolves and installs much faster and caches wheels well. Keep the lock file as the source of "
     "truth and pin uv's version so a new release does not change resolution under you."),
    ("What does `set -euo pipefail` do in bash?",
     "It exits on the first failing command, treats unset variables as errors, and makes a pipeline fail when any "
     "stage fails. Together they stop a script from going on after something broke silently."),
    ("Should this helper be a class or a function?",
     "A function, unless it keeps state between calls. Pass what it needs as arguments; a class with one method and "
     "no fields is a function wearing a costume."),
    ("How do I make this test less flaky?",
     "Find what it waits on: replace sleeps with waiting for the condition, give it its own temporary data, and pin "
     "any clock or random seed it reads. A test that fails one run in fifty is telling you about a race."),
    ("Can you explain what a write-ahead log buys us?",
     "Durability without writing every page at once: a change is appended to the log and flushed, then applied to "
     "the data files lazily. After a crash the log replays what the files missed."),
    ("When should I reach for a message queue instead of an HTTP call?",
     "When the caller need not wait for the result, when the receiver may be down for a while, or when bursts must "
     "be smoothed out. Otherwise a direct call is simpler to follow and to debug."),
]
ASKS = ["Quick one:", "Remind me:", "Sorry, I forgot:", "Before I merge:", "Going back to earlier:", ""]
TAILS = ["Just the value.", "Short answer please.", "", "Need it for the ticket."]
ACKS = ["Thanks, got it.", "OK, noted.", "Noted, I'll keep that in mind.", "Looks fine to me.", "Understood."]
PROBE_REPLIES = ["Let me look back at what you shared.", "I'd need to check the earlier messages."]


@dataclass(frozen=True)
class WorkdayScript:
    """A script: its frames per form, its seed salt; a script with forms of its own (`paraphrase`) names them, the
    turn that states a line in each (`plant(form, line, rng)`) and the numbers its files carry themselves."""

    name: str
    frames: Frames
    salt: tuple[int, int]
    forms: tuple[str, ...] = FORMS
    plant: Callable[[str, str, random.Random], Turn] | None = None
    fixed_numbers: frozenset[str] = field(default_factory=frozenset)
    values: dict[str, Callable[[random.Random], str]] | None = None


DEV = WorkdayScript("dev", DEV_FRAMES, (6151, 17))
HELD = WorkdayScript("held", HELD_FRAMES, (3079, 29))
SCRIPTS = {"dev": DEV, "held": HELD}


# numbers the frames and fillers carry themselves (`--spawn-rate 20`, `:8080`): no fact value repeats one
_FIXED_NUMBERS = frozenset(re.findall(r"\d+(?:\.\d+)?", " ".join(
    [line for frames in (*DEV_FRAMES.values(), *HELD_FRAMES.values()) for line, _, _ in frames]
    + [q + " " + a for q, a in CHAT] + ACKS + PROBE_REPLIES)))


def _tokens(turn: Turn) -> int:
    return int(len(turn.text + "".join(t for _, t in turn.attachments) + turn.reply) / CHARS_PER_TOKEN) + 12


def _module(rng: random.Random, extra: list[str]) -> tuple[str, str]:
    """A Python module of a few small functions, with `extra` lines among its constants."""
    noun = rng.choice(NOUNS)
    lines = [f'"""Helpers for {noun} handling."""', "", "import logging", "", "log = logging.getLogger(__name__)"]
    lines += extra
    for _ in range(rng.randint(3, 6)):
        verb, other = rng.choice(VERBS), rng.choice(NOUNS)
        lines += ["", "", f"def {verb}_{other}(item, *, strict=False):",
                  f'    """{verb.capitalize()} one {other} for the {noun} flow."""',
                  "    if item is None:", f'        raise ValueError("no {other}")',
                  f"    log.debug('{verb} %s', item)", "    return item"]
    return f"{rng.choice(['services', 'app', 'lib', 'core'])}/{noun}_{rng.choice(VERBS)}.py", "\n".join(lines)


def _config(rng: random.Random, extra: list[str]) -> tuple[str, str]:
    """A YAML or TOML settings file with `extra` lines among its keys."""
    noun = rng.choice(NOUNS)
    if any(" = " in line for line in extra):            # TOML frames
        lines = [f"[{noun}]", 'mode = "production"', 'log_level = "info"', *extra, "", "[http]",
                 'bind = "0.0.0.0"', "tls = true"]
        return f"config/{noun}.toml", "\n".join(lines)
    lines = [f"{noun}:", "  enabled: true", "  log_level: info", *extra, "http:", "  bind: 0.0.0.0", "  tls: true"]
    return f"deploy/{noun}.yaml", "\n".join(lines)


def _filler(rng: random.Random) -> Turn:
    if rng.random() < 0.45:
        name, text = _module(rng, [])
        return Turn("attach", f"Here's {name}, have a look.", 24, attachments=[(name, text)], reply=rng.choice(ACKS))
    question, answer = rng.choice(CHAT)
    return Turn("filler", question, 96, reply=answer)


def _plant(form: str, line: str, rng: random.Random) -> Turn:
    """The turn that states `line` in the form's way (a look-alike with another value beside it where one fits)."""
    if form == "module_constant":
        name, text = _module(rng, [line])
        return Turn("attach", f"Adding {name} for context.", 24, attachments=[(name, text)], reply=rng.choice(ACKS))
    if form == "config_key":
        name, text = _config(rng, [line])
        return Turn("attach", f"This is our {name}.", 24, attachments=[(name, text)], reply=rng.choice(ACKS))
    if form == "cli_flag":
        return Turn("chat_fact", f"I'm running this now:\n$ {line}\nand it takes a while.", 48,
                    reply="Watch its first minutes; if it stalls, check the logs it writes.")
    if form == "stack_trace":
        frames = [f'  File "{rng.choice(NOUNS)}/{rng.choice(VERBS)}.py", line {rng.randint(2000, 2999)}, in run',
                  f'  File "app/{rng.choice(NOUNS)}.py", line {rng.randint(2000, 2999)}, in handle']
        if line.startswith("  File"):                   # a frame of the trace; it ends in a plain error line
            frames.insert(rng.randint(1, len(frames)), line)
            frames.append(f"ValueError: unexpected {rng.choice(NOUNS)} state")
        else:                                           # the error line itself ends the trace
            frames.append(line)
        return Turn("chat_fact", "Got this in the logs:\nTraceback (most recent call last):\n" + "\n".join(frames),
                    64, reply="The last frame is where it failed; start there and check what it was given.")
    if form == "chat_decision":
        return Turn("chat_fact", line, 16, reply=rng.choice(ACKS))
    rows = [f"| {rng.choice(NOUNS)}-{rng.choice(VERBS)} | {rng.randint(10_000, 99_999)} units |" for _ in range(3)]
    rows.insert(rng.randint(0, 3), line)
    table = "\n".join(["| component | estimate |", "|---|---|", *rows])
    return Turn("chat_fact", "Can you put the capacity numbers we discussed in a table?", 96,
                reply=f"Here they are:\n\n{table}\n\nThe figures are for peak load.")


def make_session(seed: int, script: WorkdayScript = DEV, *, facts_per_form: int = 5) -> Session:
    """A 32K-token day: `facts_per_form` facts of each form planted over it, each probed once 2K-25K estimated
    tokens after it (the distance drawn log-uniformly first, then where in the day the fact comes), fillers
    (modules without facts, coding chat) between."""
    rng = random.Random(seed * script.salt[0] + script.salt[1])
    used: set[str] = set()
    planned: list[tuple[int, str, Fact | None, Turn | None]] = []     # (token position, kind, fact, turn)
    plant = script.plant or _plant
    for form in script.forms:
        for index in rng.sample(range(len(script.frames[form])), facts_per_form):
            line, asks, maker = script.frames[form][index]
            for _ in range(200):
                value = (script.values or VALUES)[maker](rng)
                if value not in used and value not in _FIXED_NUMBERS and value not in script.fixed_numbers:
                    break
            used.add(value)
            statement = line.format(v=value)
            fact = Fact(kind=form, frame=index, statement=statement, question=rng.choice(asks), value=value,
                        answer_tokens=[value], where="chat" if form in ("cli_flag", "stack_trace", "chat_decision",
                                                                       "assistant_table", "log_line") else "file")
            gap = int(MIN_GAP * (MAX_GAP / MIN_GAP) ** rng.random())         # log-uniform over 2K-25K
            at = rng.randint(500, DAY_TOKENS - gap - 500)
            planned.append((at, "plant", fact, plant(form, statement, rng)))
            planned.append((at + gap, "probe", fact, None))
    planned.sort(key=lambda p: (p[0], p[1] == "probe"))
    turns: list[Turn] = []
    position = 0
    planted_at: dict[int, int] = {}
    for at, kind, fact, turn in planned:
        while position < at:
            filler = _filler(rng)
            turns.append(filler)
            position += _tokens(filler)
        if kind == "plant":
            turns.append(turn)
            position += _tokens(turn)
            planted_at[id(fact)] = position           # distances count from the end of the fact's turn
        else:
            while position - planted_at[id(fact)] < MIN_GAP:
                filler = _filler(rng)
                turns.append(filler)
                position += _tokens(filler)
            probe = Turn("probe", f"{rng.choice(ASKS)} {fact.question} {rng.choice(TAILS)}".strip(), 32, fact=fact,
                         reply=rng.choice(PROBE_REPLIES))
            turns.append(probe)
            position += _tokens(probe)
    facts = [p[2] for p in planned if p[1] == "plant"]
    return Session(seed=seed, facts=facts, probed=[t.fact for t in turns if t.fact], turns=turns)
