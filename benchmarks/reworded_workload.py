"""Issue 61's tuning script for questions that share no word with their line (`bench day --script reworded`): the
paraphrase script's six forms in other domains, other files and other shapes (a restaurant, a gym, a chess server,
bike share, a dental clinic, a bakery, a museum, payroll; SQL as `ALTER TABLE ... ADD COLUMN` and wide tables,
a JSON key two objects deep, compose health checks and CPU caps), written 2026-11-29 so that levers for the
paraphrase forms are tried here and the paraphrase script stays the final check.

Invariants: as `paraphrase_workload`'s: no question shares a content word with its line, the line's enclosing key,
service or table, or its file's path (`paraphrase_workload.shared_words` over this module's CONTEXT, checked by a
unit test); sessions are `workday_workload.make_session`'s, a pure function of the seed.
"""

from __future__ import annotations

import random
import re

from .paraphrase_workload import FORMS, VALUES_HERE, shared_words
from .paraphrase_workload import _context as context_of
from .recall_workload import Turn
from .workday_workload import ACKS, Frames, WorkdayScript

FRAMES: Frames = {
    "json_key": [
        ('      "restTimerSeconds": {v},', [
            "How long is the pause between sets in the gym app?",
            "What break does the training companion give you after each round of lifting?"], "small"),
        ('      "maxOpenTickets": {v},', [
            "How many orders can the cooks have going at the same time?",
            "What's the cap on dishes being prepared simultaneously?"], "small"),
        ('      "windGustWindowSec": {v},', [
            "Over what span are the strongest breezes averaged at the rooftop weather mast?",
            "How long a period is used to spot sudden bursts of air outdoors?"], "num"),
        ('      "clockIncrementSec": {v},', [
            "How much time is added after each move in fast games?",
            "What bonus does a player get per turn in speed matches?"], "small"),
        ('      "dockReservationMinutes": {v},', [
            "How long is a bicycle slot held for a rider after booking?",
            "For what period is a parking spot for a two-wheeler kept aside?"], "small"),
        ('      "audioGuideVolumePct": {v},', [
            "How loud does the gallery narration start?",
            "At what level does the exhibit commentary play initially?"], "pct"),
    ],
    "ts_constant": [
        ("export const HOLD_TO_CONFIRM_MS = {v};", [
            "How long must a finger stay pressed before a purchase goes through?",
            "What press duration approves a payment?"], "num"),
        ("export const MAX_UNDO_DEPTH = {v};", [
            "How many steps back can someone revert in the editor?",
            "How far can a person walk back their changes in the drawing tool?"], "small"),
        ("export const SWIPE_VELOCITY_MIN = {v};", [
            "How fast must a flick be for the carousel to advance?",
            "What speed of a finger fling counts as a gesture?"], "num"),
        ("export const IDLE_LOGOUT_MINUTES = {v};", [
            "After how much inactivity is someone signed out of the banking site?",
            "When does an unattended session end automatically?"], "small"),
        ("export const PREFETCH_PAGE_COUNT = {v};", [
            "How many upcoming screens of results are loaded ahead of time?",
            "How many further listings are retrieved in advance while scrolling?"], "small"),
        ("export const TOOLTIP_SHOW_DELAY_MS = {v};", [
            "How long does the cursor have to linger before a hint bubble appears?",
            "What hover pause brings up the little help label?"], "num"),
    ],
    "compose_service": [
        ('      - "{v}:9200"', [
            "Which port on my machine talks to the full-text index?",
            "Where locally can I query the document finder engine?"], "port"),
        ('      - "{v}:15672"', [
            "What laptop port opens the message relay's management UI?",
            "On which local port is the admin console of our queueing system?"], "port"),
        ('    cpus: "{v}"', [
            "How many processor cores may the video transcoding container use?",
            "What compute share does the media converter get?"], "small"),
        ('      TOKEN_LIFESPAN: "{v}"', [
            "How long does a sign-in credential stay valid?",
            "After what period must logins be renewed?"], "num"),
        ('      MAX_CONNECTIONS: "{v}"', [
            "How many simultaneous clients can the reverse gateway accept?",
            "What's the ceiling of parallel callers on the front door?"], "num"),
        ("      interval: {v}s", [
            "How often is the dashboard container probed for liveness?",
            "At what period do we ping the charts server to see if it's alive?"], "small"),
    ],
    "sql_default": [
        ("    max_guests SMALLINT NOT NULL DEFAULT {v},", [
            "How many diners fit on one table booking unless changed?",
            "What party size is allowed per booking initially?"], "small"),
        ("ALTER TABLE appointments ADD COLUMN reminder_lead_hours INTEGER NOT NULL DEFAULT {v};", [
            "How early before a dentist visit do patients get a nudge?",
            "How far ahead of a checkup is the notice sent?"], "small"),
        ("    late_fee_cents INTEGER NOT NULL DEFAULT {v},", [
            "How much is charged when a bicycle comes back overdue?",
            "What penalty applies to tardy returns of two-wheelers?"], "num"),
        ("    rating_floor SMALLINT DEFAULT {v},", [
            "Below what score can a competitor's rank never drop?",
            "What's the lowest strength number a chess account can fall to?"], "num"),
        ("ALTER TABLE print_jobs ADD COLUMN batch_timeout_sec INTEGER NOT NULL DEFAULT {v};", [
            "How long may a paper output request wait in the copier queue before it's abandoned?",
            "When does the office copier give up on pending documents?"], "num"),
        ("    retention_days INTEGER NOT NULL DEFAULT {v},", [
            "How long are security trail records kept before purging?",
            "After what period is the compliance history thrown away?"], "small"),
    ],
    "cron_line": [
        ("{v} 2 * * * /opt/bakery/bin/order-flour", [
            "At what minute past two at night are the ingredient purchases placed?",
            "When, early each morning, do we restock the baking supplies automatically?"], "minute"),
        ("*/{v} * * * * /usr/local/bin/scrape-air-quality", [
            "How frequently is pollution data collected from the city sensors?",
            "Every how many minutes do we fetch smog measurements?"], "minute"),
        ("0 {v} * * 6 /srv/scripts/export-payroll.sh", [
            "At what hour on Saturdays are salary files produced?",
            "When on the weekend's first day do wage reports go out?"], "hour"),
        ("{v} */4 * * * /usr/local/bin/refresh-exchange-rates", [
            "At which minute of the four-hourly run are currency conversions updated?",
            "When in each four-hour cycle do we pull forex quotes?"], "minute"),
        ("30 {v} * * 1-5 /opt/clinic/send-appointment-sms", [
            "At what hour on weekdays do patients get text reminders?",
            "When on working days are the visit messages to patients dispatched?"], "hour"),
        ("0 5 {v} * * /srv/scripts/invoice-tenants", [
            "On what day of each month are renters billed?",
            "Which date monthly do apartment occupants receive their charges?"], "dom"),
    ],
    "log_line": [
        ("2026-11-28T07:12:44Z WARN  oven-ctl: chamber temperature overshoot, fan boosted for {v}s", [
            "How long did the baking unit's cooling run after it got too hot?",
            "For what duration was airflow raised when the heat spiked?"], "num"),
        ("2026-11-28T08:40:02Z INFO  matcher: paired players in {v} ms (pool 412)", [
            "How long did finding an opponent take according to the log?",
            "What time did setting up the game's opponents require?"], "num"),
        ("2026-11-28T09:15:30Z ERROR payments: card processor timed out, {v} charges retried", [
            "How many transactions had to be attempted again after the gateway stalled?",
            "What number of purchases got a second try when the acquirer hung?"], "num"),
        ("2026-11-28T10:05:18Z WARN  gps: fleet tracker lost fix on {v} vans", [
            "How many delivery vehicles disappeared from the map?",
            "What count of trucks had no position signal?"], "small"),
        ("2026-11-28T11:22:07Z INFO  backup: snapshot uploaded, {v} MB compressed", [
            "How big was the archived copy sent to storage?",
            "What size did the packed image of the data reach?"], "num"),
        ("2026-11-28T12:48:33Z ERROR thermostat: zone 3 unreachable for {v} min", [
            "How long was the heating controller for that area offline?",
            "For how much time did the climate unit in that room stop responding?"], "small"),
    ],
}

# frame line -> (file path or "" for chat, the enclosing JSON key path / compose service / SQL table)
CONTEXT: dict[str, tuple[str, str]] = {}
_JSON_PATHS = [("fitness", "workout"), ("kitchen", "tickets"), ("station", "wind"), ("chess", "blitz"),
               ("bikes", "docks"), ("museum", "audio")]
_COMPOSE = [("search", "elasticsearch:8.13.0"), ("broker", "rabbitmq:3-management"),
            ("encoder", "jrottenberg/ffmpeg:6.1"), ("auth", "quay.io/keycloak/keycloak:24.0"),
            ("proxy", "nginx:1.27"), ("grafana", "grafana/grafana:11.0.0")]
_SQL_TABLES = ["reservations", "appointments", "rentals", "players", "print_jobs", "audit_events"]
for _i, (_line, _, _) in enumerate(FRAMES["json_key"]):
    CONTEXT[_line] = ("appsettings.json", " ".join(_JSON_PATHS[_i]))
for _line, _, _ in FRAMES["ts_constant"]:
    CONTEXT[_line] = ("web/src/config.ts", "")
for _i, (_line, _, _) in enumerate(FRAMES["compose_service"]):
    CONTEXT[_line] = ("compose.yaml", _COMPOSE[_i][0])
for _i, (_line, _, _) in enumerate(FRAMES["sql_default"]):
    CONTEXT[_line] = ("db/schema.sql", _SQL_TABLES[_i])
for _line, _, _ in FRAMES["cron_line"]:
    CONTEXT[_line] = ("deploy/crontab", "")
for _line, _, _ in FRAMES["log_line"]:
    CONTEXT[_line] = ("", "")


def shared(line: str, question: str) -> set[str]:
    """`paraphrase_workload.shared_words` over this script's contexts."""
    return shared_words(line, question, CONTEXT)


def _context(statement: str) -> tuple[str, str]:
    """CONTEXT of the frame whose line (its value filled in) is `statement`."""
    return context_of(statement, CONTEXT)


# --- how each form states its line (shapes the paraphrase script's files do not have) ------------------------------
_TS_OTHER = ["export const API_BASE = '/api/v2';", "export const DEFAULT_LOCALE = 'de-DE';",
             "export const BRAND_COLOR = '#1f6feb';", "export type Role = 'admin' | 'member' | 'guest';",
             "export const ENABLE_SERVICE_WORKER = true;", "import type { Env } from './env';"]
_CRON_OTHER = ["SHELL=/bin/sh", "PATH=/usr/local/bin:/usr/bin:/bin", "MAILTO=\"\"",
               "# minute hour day-of-month month day-of-week command", "45 23 * * * /usr/local/bin/logrotate-app",
               "0 0 1 1 * /srv/scripts/yearly-archive.sh"]
_LOG_OTHER = ["2026-11-28T07:00:00Z INFO  main: boot complete (pid 4121)",
              "2026-11-28T07:00:02Z INFO  db: migrations ok",
              "2026-11-28T07:03:10Z DEBUG scheduler: 12 jobs registered",
              "2026-11-28T07:09:59Z INFO  http: 200 GET /health"]


def _json(line: str, rng: random.Random) -> tuple[str, str]:
    top, inner = _context(line)[1].split()
    body = ["{", '  "schemaVersion": 5,', '  "logging": { "level": "Information" },']
    others = [p for p in _JSON_PATHS if p[0] != top]
    rng.shuffle(others)
    for name, child in [*others[:1], (top, inner)]:
        body += [f'  "{name}": {{', '    "enabled": true,', f'    "{child}": {{']
        if name == top:
            body.append(line)
        body += ['      "mode": "standard"', "    }", "  },"]
    body += ['  "allowedHosts": "*"', "}"]
    return "appsettings.json", "\n".join(body)


def _compose(line: str, rng: random.Random) -> tuple[str, str]:
    service = _context(line)[1]
    image = dict(_COMPOSE)[service]
    body = ["services:"]
    for name, other in [p for p in _COMPOSE if p[0] != service][:1] + [(service, image)]:
        body += [f"  {name}:", f"    image: {other}"]
        if name != service:
            continue
        if line.startswith('      - "'):
            body += ["    ports:", line]
        elif line.startswith("      interval"):
            body += ["    healthcheck:", '      test: ["CMD", "curl", "-f", "http://localhost:3000/api/health"]', line,
                     "      retries: 3"]
        elif line.startswith("      "):
            body += ["    environment:", "      LOG_LEVEL: info", line]
        else:
            body += ["    deploy:", "      resources:", "        limits:", "      " + line]
    body += ["volumes:", "  data: {}"]
    return "compose.yaml", "\n".join(body)


def _sql(line: str, rng: random.Random) -> tuple[str, str]:
    table = _context(line)[1]
    if line.startswith("ALTER"):
        body = ["-- db/schema.sql (tail)", f"CREATE INDEX IF NOT EXISTS {table}_owner_idx ON {table} (owner_id);",
                line, f"COMMENT ON TABLE {table} IS 'see docs/data-model.md';"]
    else:
        columns = ["    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),", "    owner_id UUID NOT NULL,",
                   "    status TEXT NOT NULL DEFAULT 'active',", "    updated_at TIMESTAMPTZ,"]
        columns.insert(rng.randint(1, len(columns)), line)
        body = ["-- db/schema.sql", f"CREATE TABLE IF NOT EXISTS {table} (", *columns,
                "    UNIQUE (owner_id, id)", ");"]
    return "db/schema.sql", "\n".join(body)


def plant(form: str, line: str, rng: random.Random) -> Turn:
    """The turn that states `line` in the form's way: a file attached, or a pasted log."""
    if form == "json_key":
        name, text = _json(line, rng)
    elif form == "compose_service":
        name, text = _compose(line, rng)
    elif form == "sql_default":
        name, text = _sql(line, rng)
    elif form == "ts_constant":
        others = rng.sample(_TS_OTHER, 4)
        others.insert(rng.randint(0, 4), line)
        name, text = "web/src/config.ts", "\n".join(others)
    elif form == "cron_line":
        others = list(_CRON_OTHER)
        others.insert(rng.randint(4, len(others)), line)
        name, text = "deploy/crontab", "\n".join(others)
    else:
        lines = list(_LOG_OTHER)
        lines.insert(rng.randint(1, len(lines)), line)
        return Turn("chat_fact", "This came up in the console:\n" + "\n".join(lines), 48,
                    reply="One warning to watch; the rest is routine.")
    return Turn("attach", f"For reference, {name}:", 24, attachments=[(name, text)], reply=rng.choice(ACKS))


_FIXED = frozenset(re.findall(r"\d+(?:\.\d+)?", " ".join(
    [line for frames in FRAMES.values() for line, _, _ in frames] + _TS_OTHER + _CRON_OTHER + _LOG_OTHER
    + [p[1] for p in _COMPOSE] + ["5 3000 3 2"])))

REWORDED = WorkdayScript("reworded", FRAMES, (5113, 61), forms=FORMS, plant=plant, fixed_numbers=_FIXED,
                         values=VALUES_HERE)
