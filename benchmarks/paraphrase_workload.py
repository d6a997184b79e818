"""Issue 61's paraphrase script for `bench day`: the day of `workday_workload` (the same fillers, gaps and probe
framing) with facts in six forms and domains the dev and held scripts do not use (JSON settings keys, TypeScript
constants, compose services, SQL column defaults, cron lines, log lines; an e-reader, a photo album, podcasts, a
library, a ward monitor, ferries, a greenhouse, a mail relay, parcels), each asked in words that share nothing with
its line. Written before any lever of issue 61 was tried; run for the final check only, never tuned on.

Invariants: a question shares no content word with its fact's line, the line's enclosing key, service or table, or
its file's path: not a word, not an identifier's part, not a unit its abbreviation stands for (`ms`, `s`, `min`,
`mb`, `pct`, ...), compared on a five-letter prefix (`shared_words`, checked for every frame by a unit test); the
sessions are `workday_workload.make_session`'s (a pure function of the seed), so every promise of that module holds.
"""

from __future__ import annotations

import random
import re

from .recall_workload import Turn
from .workday_workload import ACKS, VALUES, Frames, WorkdayScript

FORMS = ("json_key", "ts_constant", "compose_service", "sql_default", "cron_line", "log_line")

# form -> frames: (the line with {v}, questions sharing no content word with it or its context, value maker).
# The context a frame's line sits in (a JSON section, a compose service, a SQL table, a file path) is in CONTEXT.
FRAMES: Frames = {
    "json_key": [
        ('    "pageTurnAnimationMs": {v},', [
            "How quickly does flipping to the next screen of an e-book play out?",
            "What duration does the leaf-flip effect in the book viewer last?"], "num"),
        ('    "thumbnailCacheEntries": {v},', [
            "How many small preview pictures do we keep around in memory for the photo album?",
            "Up to how many shrunken images are remembered by the picture browser?"], "num"),
        ('    "skipForwardSeconds": {v},', [
            "How far ahead does the jump button move an episode?",
            "By how much does tapping fast-advance move through a show?"], "small"),
        ('    "conflictRetryLimit": {v},', [
            "How many times do we attempt again when two devices edited the same note?",
            "When offline edits clash, after how many tries do we give up merging?"], "small"),
        ('    "digestBatchSize": {v},', [
            "How many alerts are bundled into one summary message?",
            "What's the count of pings grouped together before a roundup goes out?"], "num"),
        ('    "chunkSizeKb": {v},', [
            "How large is each slice when a big attachment is transferred piecewise?",
            "What portion do we split large media transfers into?"], "num"),
    ],
    "ts_constant": [
        ("export const CURSOR_BLINK_INTERVAL_MS = {v};", [
            "How often does the text caret flash in the editor?",
            "At what rhythm does the insertion point pulse on and off?"], "num"),
        ("export const MAX_TOAST_STACK = {v};", [
            "How many pop-up notices can pile up on screen at once?",
            "What's the largest number of transient banners we show together?"], "small"),
        ("export const DRAG_THRESHOLD_PX = {v};", [
            "How far must the pointer travel before a move gesture begins?",
            "What mouse distance starts picking an item up?"], "small"),
        ("export const SEARCH_DEBOUNCE_MS = {v};", [
            "How long do we wait after a keystroke before querying for matches?",
            "What pause in typing triggers the lookup request?"], "num"),
        ("export const OFFLINE_QUEUE_LIMIT = {v};", [
            "How many actions are held while there's no network?",
            "Up to what count do pending edits pile up when disconnected?"], "num"),
        ("export const AUTOPLAY_PREVIEW_DELAY_MS = {v};", [
            "How long does the pointer have to rest on a video card before it starts playing?",
            "What hover wait kicks off the clip teaser?"], "num"),
    ],
    "compose_service": [
        ('      - "{v}:5432"', [
            "On which host port can I reach the Postgres container from my laptop?",
            "What outside port is mapped to the relational store's container?"], "port"),
        ("    mem_limit: {v}m", [
            "How much RAM is the key-value cache's container allowed?",
            "What's the ceiling on RAM for the caching box locally?"], "num"),
        ('      CELERY_CONCURRENCY: "{v}"', [
            "How many tasks does the background job runner process in parallel?",
            "With what parallelism does the async task executor start?"], "small"),
        ('      - "{v}:9000"', [
            "Which local port exposes the S3-compatible object storage?",
            "Where on localhost do I point the bucket client?"], "port"),
        ("    stop_grace_period: {v}s", [
            "How long does the backend container get to shut down cleanly?",
            "What's the wind-down window before the web backend is killed?"], "num"),
        ('    shm_size: "{v}mb"', [
            "How big is the scratch RAM disk of the headless Chrome container?",
            "How much tmpfs space did we hand the screenshot renderer?"], "num"),
    ],
    "sql_default": [
        ("    max_renewals SMALLINT NOT NULL DEFAULT {v},", [
            "How many times can a borrower extend a library book unless told otherwise?",
            "What's the standard number of extensions a patron gets?"], "small"),
        ("    sample_every_seconds INTEGER NOT NULL DEFAULT {v},", [
            "How often are a patient's heart readings recorded out of the box?",
            "At what cadence do bedside measurements get stored initially?"], "num"),
        ("    checkin_closes_min INTEGER NOT NULL DEFAULT {v},", [
            "How long before sailing does boarding registration shut for a crossing?",
            "When does the gate stop admitting passengers before the boat leaves?"], "small"),
        ("    target_humidity_pct NUMERIC(4,1) DEFAULT {v},", [
            "What moisture level in the air do planting areas aim for, unless configured?",
            "How damp should a growing bay be kept at first?"], "pct"),
        ("    crossfade_ms INTEGER NOT NULL DEFAULT {v},", [
            "How long is the blend between two songs in the player?",
            "What overlap do consecutive tunes get when one ends?"], "num"),
        ("    sla_hours INTEGER NOT NULL DEFAULT {v},", [
            "Within how long must a support request be answered, normally?",
            "What response deadline applies to a helpdesk case?"], "small"),
    ],
    "cron_line": [
        ("{v} 4 * * * /opt/library/bin/purge-holds --older-than 14d", [
            "At how many minutes past four a.m. do stale reservations get cleared?",
            "When exactly in the early morning does the cleanup of expired book requests run?"], "minute"),
        ("*/{v} * * * * /usr/local/bin/poll-weather-station", [
            "How frequently do we fetch readings from the meteorological sensor?",
            "Every how many minutes is the rooftop climate gauge queried?"], "minute"),
        ("0 {v} * * 0 /srv/scripts/rotate-certs.sh", [
            "At what hour on Sundays are the HTTPS keys swapped out?",
            "When, on the weekly run, do we refresh our site's encryption credentials?"], "hour"),
        ("{v} */6 * * * /usr/local/bin/sync-ferry-timetable", [
            "At which minute of the six-hourly run are the boat schedules refreshed?",
            "When in each quarter-day job do the crossing departure lists get pulled?"], "minute"),
        ("15 {v} * * 1-5 /opt/greenhouse/water-zones", [
            "At what hour on weekdays do the plants get irrigated?",
            "When on working days does the sprinkler cycle start, hour-wise?"], "hour"),
        ("0 6 {v} * * /srv/scripts/email-loan-reminders", [
            "On what day of each month do borrowers get their overdue notices?",
            "Which date every month are patrons nudged about books they still have?"], "dom"),
    ],
    "log_line": [
        ("2026-11-28T08:14:03Z WARN  pump-ctl: soil moisture below threshold, watering for {v}s", [
            "How long did the irrigation run after the dryness alert?",
            "What duration did the sprinkler cycle last after the dry-ground alert?"], "num"),
        ("2026-11-28T09:02:41Z INFO  encoder: transcoded episode in {v} ms (bitrate 128k)", [
            "How long did converting the show's audio take according to the log?",
            "What processing time did the podcast conversion report?"], "num"),
        ("2026-11-28T10:20:17Z ERROR mailer: SMTP relay rejected batch, {v} recipients deferred", [
            "How many people's messages were postponed when the outbound gateway refused them?",
            "What number of addressees got put off by that outgoing bounce?"], "num"),
        ("2026-11-28T11:45:09Z WARN  vitals: heart-rate feed stalled, last sample {v} s ago", [
            "How stale was the cardiac monitor's newest reading when it froze?",
            "How long had the pulse stream been silent by the time of that alert?"], "num"),
        ("2026-11-28T12:03:55Z ERROR scanner: barcode unreadable on {v} parcels this shift", [
            "How many packages couldn't be identified by the label reader today?",
            "What count of boxes failed the code reading during this work period?"], "num"),
        ("2026-11-28T13:30:12Z INFO  booking: cabin hold released after {v} min without payment", [
            "How long was the berth reservation kept before it lapsed unpaid?",
            "After what wait did the sleeping berth go back on sale when nobody paid?"], "small"),
    ],
}

# frame line -> (file path or "" for chat, the enclosing JSON section / compose service / SQL table)
CONTEXT: dict[str, tuple[str, str]] = {}
_JSON_SECTIONS = ["reader", "gallery", "podcast", "sync", "notifications", "uploads"]
_COMPOSE_SERVICES = ["db", "redis", "worker", "minio", "api", "browser"]
_SQL_TABLES = ["loans", "vitals", "ferry_bookings", "greenhouse_zones", "tracks", "tickets"]
for _i, (_line, _, _) in enumerate(FRAMES["json_key"]):
    CONTEXT[_line] = ("config/settings.json", _JSON_SECTIONS[_i])
for _i, (_line, _, _) in enumerate(FRAMES["ts_constant"]):
    CONTEXT[_line] = ("src/constants.ts", "")
for _i, (_line, _, _) in enumerate(FRAMES["compose_service"]):
    CONTEXT[_line] = ("docker-compose.yml", _COMPOSE_SERVICES[_i])
for _i, (_line, _, _) in enumerate(FRAMES["sql_default"]):
    CONTEXT[_line] = ("migrations/0007_tables.sql", _SQL_TABLES[_i])
for _i, (_line, _, _) in enumerate(FRAMES["cron_line"]):
    CONTEXT[_line] = ("ops/crontab", "")
for _i, (_line, _, _) in enumerate(FRAMES["log_line"]):
    CONTEXT[_line] = ("", "")

VALUES_HERE = {**VALUES, "pct": lambda rng: str(rng.randint(41, 89)), "hour": lambda rng: str(rng.randint(1, 23)),
               "dom": lambda rng: str(rng.randint(2, 28)), "minute": lambda rng: str(rng.randint(3, 58))}

# --- the no-shared-word check (the workload's own, independent of the engine's tokenizer) --------------------------
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_UNITS = {"ms": "millisecond", "s": "second", "sec": "second", "secs": "second", "min": "minute", "mins": "minute",
          "m": "megabyte", "mb": "megabyte", "kb": "kilobyte", "gb": "gigabyte", "pct": "percent", "px": "pixel",
          "max": "maximum", "min_": "minimum", "hz": "hertz", "db": "database", "cfg": "config", "mem": "memory",
          "num": "number", "cnt": "count", "repo": "repository", "env": "environment", "dir": "directory",
          "ctl": "control", "shm": "shared", "sla": "agreement", "certs": "certificate", "tz": "timezone"}
_QUIET_WORDS = """a about above after again all also am an and any are as at be been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here hers
him his how i if in into is it its itself just let me more most my no nor not now of off on once only or other our
out over own same she should so some such than that the their theirs them then there these they this those through
to too under until up very was we were what when where which while who whom why will with would you your yours
z t usr bin srv opt local"""
_QUIET = frozenset(_QUIET_WORDS.split())


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)} - _QUIET


def _key(word: str) -> str:
    return word[:5] if len(word) >= 5 else word


def shared_words(line: str, question: str, context: dict[str, tuple[str, str]] | None = None) -> set[str]:
    """The content words `question` shares with `line`, its context and its file's path (words, identifiers' parts
    and what a unit abbreviation stands for, compared on their first five letters; numbers count as words);
    `context`: the script's CONTEXT (this one's by default)."""
    path, section = (CONTEXT if context is None else context).get(line, ("", ""))
    theirs = _words(line) | _words(path) | _words(section)
    theirs |= {_UNITS[w] for w in theirs if w in _UNITS}
    if "max" in theirs:
        theirs.add("maximum")
    if "min" in theirs:
        theirs.add("minimum")
    mine = {w for w in _words(question) if len(w) > 1 or w.isdigit()}      # "what's" is no "s"
    return {w for w in mine if _key(w) in {_key(t) for t in theirs}}


def _context(statement: str, contexts: dict[str, tuple[str, str]] | None = None) -> tuple[str, str]:
    """The context (CONTEXT's, or `contexts`': another script's) of the frame whose line, its value filled in, is
    `statement`."""
    for template, context in (CONTEXT if contexts is None else contexts).items():
        head, _, tail = template.partition("{v}")
        if statement.startswith(head) and statement.endswith(tail):
            return context
    raise KeyError(statement)


# --- how each form states its line -----------------------------------------------------------------------------
_TS_OTHER = ["export const APP_NAME = 'atlas';", "export const THEME_STORAGE_KEY = 'ui.theme';",
             "export const ROUTES = { home: '/', settings: '/settings' } as const;",
             "export type Mode = 'light' | 'dark';", "export const FEATURE_BETA_BANNER = false;"]
_CRON_OTHER = ["SHELL=/bin/bash", "MAILTO=ops@example.org", "# m h dom mon dow command",
               "0 3 * * * /usr/local/bin/backup-db", "30 1 * * 6 /srv/scripts/vacuum-analyze.sh"]
_LOG_OTHER = ["2026-11-28T08:00:00Z INFO  app: started, build 7f3c2e1", "2026-11-28T08:00:01Z INFO  http: listening",
              "2026-11-28T08:05:12Z DEBUG cache: warmed", "2026-11-28T08:07:44Z INFO  health: ok"]


def _json(line: str, rng: random.Random) -> tuple[str, str]:
    section = _context(line)[1]
    others = [s for s in _JSON_SECTIONS if s != section]
    rng.shuffle(others)
    body = ["{", '  "version": 3,', '  "locale": "en-GB",']
    for name in [*others[:2], section]:
        body.append(f'  "{name}": {{')
        body.append('    "enabled": true,')
        if name == section:
            body.append(line)
        body.append('    "theme": "system"')
        body.append("  },")
    body += ['  "telemetry": false', "}"]
    return "config/settings.json", "\n".join(body)


def _compose(line: str, rng: random.Random) -> tuple[str, str]:
    service = _context(line)[1]
    images = {"db": "postgres:16", "redis": "redis:7", "worker": "atlas-worker:dev", "minio": "minio/minio",
              "api": "atlas-api:dev", "browser": "browserless/chrome"}
    body = ['version: "3.9"', "services:"]
    for name in [n for n in _COMPOSE_SERVICES if n != service][:2] + [service]:
        body += [f"  {name}:", f"    image: {images[name]}", "    restart: unless-stopped"]
        if name == service:
            if line.startswith('      - "'):
                body += ["    ports:", line]
            elif line.startswith("      "):
                body += ["    environment:", line]
            else:
                body.append(line)
    return "docker-compose.yml", "\n".join(body)


def _sql(line: str, rng: random.Random) -> tuple[str, str]:
    table = _context(line)[1]
    body = ["-- 0007_tables.sql", "BEGIN;", f"CREATE TABLE {table} (", "    id BIGSERIAL PRIMARY KEY,",
            "    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),", line, "    note TEXT", ");",
            f"CREATE INDEX ON {table} (created_at);", "COMMIT;"]
    return "migrations/0007_tables.sql", "\n".join(body)


def plant(form: str, line: str, rng: random.Random) -> Turn:
    """The turn that states `line` in the form's way: a file attached, or a pasted log."""
    if form == "json_key":
        name, text = _json(line, rng)
    elif form == "compose_service":
        name, text = _compose(line, rng)
    elif form == "sql_default":
        name, text = _sql(line, rng)
    elif form == "ts_constant":
        others = rng.sample(_TS_OTHER, 3)
        others.insert(rng.randint(0, 3), line)
        name, text = "src/constants.ts", "\n".join(["// shared client constants", *others])
    elif form == "cron_line":
        others = list(_CRON_OTHER)
        others.insert(rng.randint(3, len(others)), line)
        name, text = "ops/crontab", "\n".join(others)
    else:
        lines = list(_LOG_OTHER)
        lines.insert(rng.randint(1, len(lines)), line)
        return Turn("chat_fact", "Seeing this in the service output:\n" + "\n".join(lines), 48,
                    reply="Nothing there looks fatal; keep an eye on the warnings.")
    return Turn("attach", f"Here's {name} as it stands.", 24, attachments=[(name, text)], reply=rng.choice(ACKS))


_FIXED = frozenset(re.findall(r"\d+(?:\.\d+)?", " ".join(
    [line for frames in FRAMES.values() for line, _, _ in frames] + _TS_OTHER + _CRON_OTHER + _LOG_OTHER
    + ["3.9 16 7 5432 9000 0007 3 2"])))

PARAPHRASE = WorkdayScript("paraphrase", FRAMES, (7841, 43), forms=FORMS, plant=plant, fixed_numbers=_FIXED,
                          values=VALUES_HERE)
