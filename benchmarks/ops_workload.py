"""A fourth retrieval workload, written before any lever was tried on it (2026-11-26, fifth pass): a day on a data
pipeline's operations, with file kinds no other family has (Terraform, a GitHub Actions workflow, a systemd unit, a
crontab, TypeScript and package.json, Rust and Cargo.toml, Prometheus alert rules) and facts stated in chat.

Invariants: as the day family's (`day_workload.make_day_session`): a session is a pure function of its seed, every
fact value is unique in its session, a probe comes at least three turns after its fact, in other words.
"""

from __future__ import annotations

from .day_workload import DayScript, make_day_session
from .recall_workload import Session

FACT_TYPES = ("infra", "ci", "service", "schedule", "web", "rust", "alert", "chat")

# type -> frames: (line with {v}, file kind, questions that avoid the line's words, value maker)
FRAMES: dict[str, list[tuple[str, str, list[str], str]]] = {
    "infra": [
        ("  allocated_storage       = {v}", "terraform",
         ["How many gigabytes of disk did we give the managed Postgres?",
          "What size is the RDS volume provisioned at?"], "num"),
        ("  desired_capacity    = {v}", "terraform",
         ["How many worker machines does the fleet keep up on a normal day?",
          "What node count does the scaling group hold when nothing is happening?"], "small"),
    ],
    "ci": [
        ("    timeout-minutes: {v}", "actions",
         ["How long may a pipeline job run before GitHub kills it?",
          "What is the time limit on our test job in CI?"], "small"),
        ('          node-version: "{v}"', "actions",
         ["Which JavaScript runtime release do the automated checks use?",
          "On what major release of the JS engine does the workflow test?"], "major"),
    ],
    "service": [
        ("RestartSec={v}", "systemd",
         ["How long does the OS wait before bringing the ingest daemon back after a crash?",
          "What pause is there between automatic relaunches of the worker?"], "small"),
        ("LimitNOFILE={v}", "systemd",
         ["How many descriptors may the ingest process hold open?",
          "What's the ceiling on open handles for that unit?"], "num"),
    ],
    "schedule": [
        ("{v} 3 * * * /opt/etl/bin/export_warehouse.sh", "cron",
         ["At what minute past 3 am does the data dump to the analytics store begin?",
          "When exactly in the three o'clock hour does that nightly job start?"], "minute"),
        ("*/{v} * * * * /opt/etl/bin/sync_inventory.py", "cron",
         ["How often, in minutes, does the stock refresh run?",
          "Every how many minutes do we pull warehouse counts?"], "small"),
    ],
    "web": [
        ("export const MAX_UPLOAD_MB = {v};", "typescript",
         ["What is the largest attachment the browser client accepts?",
          "How big can a file be before the frontend refuses it?"], "small"),
        ('    "retries": {v},', "package",
         ["How many times does the e2e runner try a flaky spec again?",
          "After how many reruns does the browser test suite give up on a failing case?"], "small"),
    ],
    "rust": [
        ("const CHANNEL_CAPACITY: usize = {v};", "rust",
         ["How many messages can queue up between the parser and the writer threads?",
          "What bound did we put on the in-flight queue in the Rust service?"], "num"),
        ('rust-version = "{v}"', "cargo",
         ["What is the oldest compiler the crate promises to build with?",
          "Which MSRV did we declare for the ingest binary?"], "rustc"),
    ],
    "alert": [
        ("        expr: histogram_quantile(0.99, rate(http_request_duration_seconds_bucket[5m])) > {v}", "rules",
         ["At what p99 latency in seconds do we get paged?",
          "What tail response time sets off the slow-requests alarm?"], "rate"),
        ("        for: {v}m", "rules",
         ["How long must the error spike last before anyone is notified?",
          "For how many minutes does the condition have to hold before the page goes out?"], "small"),
    ],
    "chat": [
        ("FYI our failover is {v} now, the old standby was retired", "chat",
         ["Where do we fail over to if the primary cloud location goes down?",
          "Which AWS area is the backup site these days?"], "region"),
        ("note to self: the vendor API key expires on day {v} of next month", "chat",
         ["When does the third-party credential run out?",
          "On what date do we need to renew the supplier's token?"], "day"),
    ],
}

REGIONS = ["eu-west-1", "us-east-2", "ap-south-1", "eu-central-1", "us-west-2", "ca-central-1"]
VALUES = {
    "num": lambda rng: str(rng.randint(130, 9700)),
    "small": lambda rng: str(rng.randint(4, 58)),
    "minute": lambda rng: str(rng.randint(5, 55)),
    "major": lambda rng: str(rng.randint(16, 24)),
    "rustc": lambda rng: f"1.{rng.randint(70, 86)}",
    "rate": lambda rng: f"{rng.randint(1, 4)}.{rng.randint(1, 9)}",
    "region": lambda rng: rng.choice(REGIONS),
    "day": lambda rng: str(rng.randint(10, 28)),
}

FILLER = {
    "terraform": ['resource "aws_db_instance" "warehouse" {', '  engine                  = "postgres"',
                  '  instance_class          = "db.r6g.large"', "  multi_az                = true", "}", "",
                  'resource "aws_autoscaling_group" "workers" {', "  min_size            = 1",
                  '  vpc_zone_identifier = var.private_subnets', "}"],
    "actions": ["name: ci", "on: [push, pull_request]", "jobs:", "  test:", "    runs-on: ubuntu-latest", "    steps:",
                "      - uses: actions/checkout@v4", "      - uses: actions/setup-node@v4", "        with:",
                "      - run: npm ci && npm test"],
    "systemd": ["[Unit]", "Description=Ingest worker", "After=network-online.target", "", "[Service]",
                "ExecStart=/opt/etl/bin/ingest --config /etc/etl/ingest.toml", "Restart=on-failure", "User=etl", "",
                "[Install]", "WantedBy=multi-user.target"],
    "cron": ["SHELL=/bin/bash", "MAILTO=ops@example.org", "# m h dom mon dow command",
             "@reboot /opt/etl/bin/warm_cache.sh"],
    "typescript": ['import { z } from "zod";', "", "export const uploadSchema = z.object({", "  name: z.string(),",
                   "  size: z.number().int(),", "});", "", "export function humanSize(bytes: number): string {",
                   "  return `${(bytes / 1e6).toFixed(1)} MB`;", "}"],
    "package": ["{", '  "name": "pipeline-console",', '  "private": true,', '  "scripts": {',
                '    "test": "vitest run",', '    "e2e": "playwright test"', "  },", '  "playwright": {', "  }",
                "}"],
    "rust": ["use std::sync::mpsc;", "", "pub struct Writer {", "    rx: mpsc::Receiver<Record>,", "}", "",
             "impl Writer {", "    pub fn run(self) {", "        for record in self.rx {",
             "            record.flush();", "        }", "    }", "}"],
    "cargo": ["[package]", 'name = "ingest"', 'version = "0.4.2"', 'edition = "2021"', "", "[dependencies]",
              'serde = { version = "1", features = ["derive"] }', 'tokio = { version = "1", features = ["full"] }'],
    "rules": ["groups:", "- name: api", "  rules:", "  - alert: SlowRequests", "    annotations:",
              "      summary: API tail latency is high", "  - alert: ErrorBurst",
              '        expr: sum(rate(http_requests_total{status=~"5.."}[1m])) > 1'],
}
FILE_NAMES = {"terraform": ["infra/main.tf", "infra/database.tf"], "actions": [".github/workflows/ci.yml"],
              "systemd": ["deploy/ingest.service"], "cron": ["deploy/etl.crontab"],
              "typescript": ["web/src/upload.ts"], "package": ["web/package.json"],
              "rust": ["ingest/src/writer.rs", "ingest/src/pipeline.rs"], "cargo": ["ingest/Cargo.toml"],
              "rules": ["monitoring/alerts.yml"]}

FILLER_TURNS = [
    ("How do I stop two people running terraform apply at the same time?", 90,
     "Use a remote backend with state locking: an S3 bucket for the state and a DynamoDB table named in "
     "`dynamodb_table`; every plan and apply takes the lock first, and a second run waits or fails with the "
     "holder's name. `terraform force-unlock` clears a lock left by a crashed run."),
    ("Why is my GitHub Actions cache never hit?", 80,
     "The key probably changes on every run: build it from the lock file's hash, e.g. "
     "`hashFiles('package-lock.json')`, not from the commit. Add `restore-keys` with a shorter prefix so a near "
     "match is restored when the exact key misses."),
    ("How do I read the logs of a systemd service since yesterday?", 60,
     "`journalctl -u ingest.service --since yesterday` prints them; add `-f` to follow new lines and `-p err` to "
     "see errors only."),
    ("Cron or systemd timers for scheduled jobs?", 100,
     "Timers log to the journal, can catch up on runs missed while the machine was off (`Persistent=true`) and "
     "share the unit's resource limits; cron is simpler and everywhere. For a server you already manage with "
     "systemd, timers are the better default."),
    ("Explain TypeScript's `unknown` versus `any`.", 80,
     "Both accept any value, but `any` switches type checking off for everything it touches, while `unknown` "
     "makes you narrow it (a `typeof` check, a schema parse) before use. Prefer `unknown` at boundaries such as "
     "JSON input."),
    ("Why does the borrow checker reject pushing to a vec while I iterate over it?", 110,
     "Iterating borrows the vector immutably for the whole loop, and `push` needs a mutable borrow; growing could "
     "reallocate and leave the iterator pointing at freed memory. Collect the new items into a second vector and "
     "`extend` after the loop, or iterate over indices."),
    ("What's the difference between rate and irate in PromQL?", 80,
     "`rate` averages the per-second increase over the whole range, smoothing spikes; `irate` uses only the last "
     "two samples, so it reacts fast but is noisy. Alert on `rate`, graph with `irate` when you need detail."),
    ("How do I squash my last few commits before opening a PR?", 70,
     "`git rebase -i HEAD~4`, mark every commit but the first as `squash` (or `fixup` to drop its message), save, "
     "then `git push --force-with-lease` to update the branch without clobbering someone else's push."),
]

OPS = DayScript(
    fact_types=FACT_TYPES, frames=FRAMES, values=VALUES, filler_lines=FILLER, file_names=FILE_NAMES,
    filler_turns=FILLER_TURNS,
    asks=["Hey,", "Quick check:", "I lost track:", "For the runbook:", ""],
    tails=["Just the number or name.", "Keep it short.", "Thanks!", ""],
    acks=["Got it, thanks.", "Read it.", "OK, noted.", "Makes sense."],
    probe_replies=["I'll check what you sent earlier.", "Let me find that in the files."],
    attach_texts=["Pasting the ops files.", "Here is what's deployed:", "More of the pipeline repo."],
    salt=(6271, 29))


def make_session(seed: int, *, probes: int = 4) -> Session:
    """A session of the ops family (`make_day_session` with this module's script)."""
    return make_day_session(seed, OPS, probes=probes)
