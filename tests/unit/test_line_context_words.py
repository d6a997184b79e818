"""Identifiers read as words (issue 61, first pass): `line_context.read_as_words` and `expansions` on plain strings,
the context `spell_out` carries into a JSON key, a code declaration, a SQL column default and a YAML list item, and
the recall signals' use of the words (`words`: a version in the line key, the expansions in the BM25 lines; off,
every key and line as before)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.rig import Rig
from helpers.word_embedder import CountingEmbedder

from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.memory import lexical, recall_signals
from evoke_engine.memory.line_context import bare_declaration, expansions, read_as_words, spell_out, sql_table
from evoke_engine.memory.recall_signals import WORDS_VERSION, lexical_lines, line_key, line_vectors

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("line, words", [
    ("export const STATUS_REFRESH_MS = 4500;", "export const status refresh milliseconds = 4500;"),
    ('  "autosaveDelayMs": 900,', '  "autosave delay milliseconds": 900,'),
    ("retry_budget: 3", "retry budget: 3"),
    ("CACHE_TTL_SEC = 30", "cache time to live seconds = 30"),
    ("maxConnCnt = 8", "maximum connection count = 8"),
    ("DB_DIR=/var/lib/app", "database directory=/var/lib/app"),
    ("user_tz: Europe/Oslo", "user timezone: Europe/Oslo"),
    ("RepoCfg = envName", "repository configuration = environment name"),
])
def test_identifiers_read_as_words_with_their_abbreviations_expanded(line, words):
    assert read_as_words(line) == words


@pytest.mark.parametrize("line, words", [
    ("watering for 841s", "watering for 841 seconds"),
    ("last sample 4047 s ago", "last sample 4047 seconds ago"),
    ("took 12 ms, then 3.5h", "took 12 milliseconds, then 3.5 hours"),
    ("released after 54 min", "released after 54 minutes"),
    ("MIN_REPLICAS = 2", "minimum replicas = 2"),
    ("closes_min INTEGER", "closes minutes INTEGER"),
])
def test_a_unit_after_a_number_and_min_read_by_where_they_stand(line, words):
    assert read_as_words(line) == words


@pytest.mark.parametrize("line", ["Tell us the max, then the min.", "It's fine: s is a letter.", "Python 3.11 and v2",
                                  "sha256 of boto3", "We use h for help.", "2026-11-28T08:14:03Z INFO app: ok"])
def test_prose_words_letters_and_versions_stay_as_written(line):
    assert read_as_words(line) == line


def test_the_db_and_a_repo_in_prose_are_spelled_out():
    assert read_as_words("the db lives in that repo") == "the database lives in that repository"


def test_expansions_are_the_words_a_line_does_not_hold_as_written():
    assert expansions("export const CURSOR_BLINK_MS = 530;") == ["milliseconds"]
    assert expansions("watering for 841s") == ["seconds"]
    assert expansions("autosaveDelayMs: 900") == ["autosave", "delay", "milliseconds"]
    assert expansions("Nothing to see here.") == []


def test_a_json_key_reads_its_object_path():
    text = '{\n  "editor": {\n    "draft": {\n      "autosaveDelayMs": 900,\n      "on": true\n    }\n  }\n}'
    lines = spell_out(text, "config/settings.json").splitlines()
    assert lines[3] == "config settings json editor draft autosave delay ms: 900"
    assert lines[1] == '  "editor": {'                                   # a parent alone states no value


def test_a_code_declaration_reads_as_its_name_and_value():
    text = "export const MAX_TOAST_STACK = 4;\nconst retryBudget: number = 3;\nlet other = compute();"
    lines = spell_out(text, "src/limits.ts").splitlines()
    assert lines[0] == "src limits ts max toast stack = 4"
    assert lines[1] == "src limits ts retry budget = 3"
    assert lines[2] == "let other = compute();"                          # no scalar: as written


def test_a_sql_column_default_reads_its_table():
    text = "CREATE TABLE IF NOT EXISTS ferry_bookings (\n    id BIGSERIAL PRIMARY KEY,\n" \
           "    checkin_closes_min INTEGER NOT NULL DEFAULT 45,\n    note TEXT\n);\nUPDATE t SET a = 1;"
    lines = spell_out(text, "migrations/0007.sql").splitlines()
    assert lines[2] == "migrations 0007 sql table ferry bookings checkin closes min default 45"
    assert lines[3] == "    note TEXT"
    priced = "CREATE TABLE fares (\n    base_fare NUMERIC(6, 2) NOT NULL DEFAULT 12.50,\n    seats INT DEFAULT 40\n);"
    assert spell_out(priced, None).splitlines()[1:3] == ["table fares base fare default 12.50",
                                                        "table fares seats default 40"]     # a precision's comma
    assert sql_table(text.splitlines(), 2) == "ferry_bookings" and sql_table(text.splitlines(), 5) is None


@pytest.mark.parametrize("text, spelled", [
    ("ALTER TABLE print_jobs ADD COLUMN batch_timeout_sec INTEGER NOT NULL DEFAULT 30;",
     "migrations 0009 sql table print jobs batch timeout sec default 30"),
    ("ALTER TABLE ONLY public.print_jobs ALTER COLUMN batch_timeout_sec SET DEFAULT 30;",
     "migrations 0009 sql table public print jobs batch timeout sec default 30"),
    ('ALTER TABLE "shifts" ADD "break_minutes" integer DEFAULT 30 NOT NULL;',
     "migrations 0009 sql table shifts break minutes default 30"),
    ("ALTER TABLE shifts DROP COLUMN break_minutes;", "ALTER TABLE shifts DROP COLUMN break_minutes;"),
])
def test_a_migrations_default_reads_the_table_on_its_line(text, spelled):
    assert spell_out(text, "migrations/0009.sql") == spelled


def test_quoted_sql_names_read_as_bare_ones():
    postgres = 'CREATE TABLE "public"."shifts" (\n    "break_minutes" integer NOT NULL DEFAULT 30,\n    id int\n);'
    mysql = "CREATE TABLE `shifts` (\n  `break_minutes` int(11) NOT NULL DEFAULT '30' COMMENT 'unpaid',\n  id int\n);"
    assert spell_out(postgres).splitlines()[1] == "table public shifts break minutes default 30"
    assert spell_out(mysql).splitlines()[1] == "table shifts break minutes default '30'"
    assert sql_table(postgres.splitlines(), 1) == "public.shifts"


def test_a_compose_port_reads_its_service_and_an_environment_key_its_service():
    text = 'services:\n  db:\n    image: postgres:16\n    ports:\n      - "6543:5432"\n' \
           '  worker:\n    environment:\n      CELERY_CONCURRENCY: "8"'
    lines = spell_out(text, "docker-compose.yml").splitlines()
    assert lines[4] == 'docker compose yml services db ports "6543:5432"'
    assert lines[7] == 'docker compose yml services worker environment celery concurrency: "8"'


def _file_block(text: str, name: str = "src/limits.ts") -> Block:
    return Block(name=f"file:{name}#0", role="file", turn=1, tokens=[len(text), 7], text=text, file_name=name,
                 state=BlockState.RAM)


def test_the_signals_read_the_words_only_when_asked(monkeypatch):
    monkeypatch.setattr(recall_signals, "BARE_DECLARATIONS", False)
    block = _file_block("// limits\nexport const SEARCH_DEBOUNCE_MS = 250;")
    assert line_key(block) == block.hash and line_key(block, words=True) == f"{block.hash}|w{WORDS_VERSION}"
    assert [line.split(" src/limits.ts")[0] for line in lexical_lines(block, words=True)] == \
        [line.split(" src/limits.ts")[0] for line in lexical_lines(block)]                  # the line as written
    assert lexical_lines(block, words=True)[0].endswith("src/limits.ts milliseconds source")
    asked = "How many milliseconds do we wait?"
    assert lexical.bm25_lines({"b": lexical_lines(block)}, asked) == {}
    assert lexical.bm25_lines({"b": lexical_lines(block, words=True)}, asked)["b"] > 0
    plain, read = CountingEmbedder(), CountingEmbedder()
    line_vectors(plain, [block])
    line_vectors(read, [block], words=True)
    assert any("SEARCH DEBOUNCE MS" in text for text in plain.texts)
    assert any("search debounce milliseconds = 250" in text for text in read.texts)


def test_the_memory_reads_the_words_only_when_on_and_the_working_set_has_grown(tmp_path, monkeypatch):
    """Budgets up to `recovery_width_tokens` decide as before with the lever on (the short suites' figures hold)."""
    rig = Rig(tmp_path, recall_signal="lines", recovery_top_k=2)            # a budget of 200 tokens
    try:
        for on, per, expect in [(False, 100, False), (True, 1024, False), (True, 100, True)]:
            monkeypatch.setattr(recall_signals, "IDENTIFIER_WORDS", on)
            memory = rig.memory(f"c{on}{per}", settings=dataclasses.replace(rig.settings, recovery_width_tokens=per))
            assert memory._identifier_words_apply() is expect, (on, per)
            memory.release()
    finally:
        rig.close()


def test_spelled_out_lines_beside_the_written_ones_only_when_asked():
    block = _file_block('{\n  "editor": {\n    "autosaveDelayMs": 900,\n    "theme": "dark-high-contrast"\n  }\n}',
                        "config/settings.json")
    written = recall_signals.fact_lines(block)
    beside = recall_signals.fact_lines(block, beside=True)
    assert beside[:len(written)] == written
    assert any("config settings json editor autosave delay ms: 900" in line for line in beside[len(written):])
    assert line_key(block, beside=True) == f"{block.hash}|x{recall_signals.CONTEXT_BESIDE_VERSION}"
    assert line_key(block, line_context=True, beside=True) == line_key(block, line_context=True)   # instead wins
    read = CountingEmbedder()
    line_vectors(read, [block], words=True, beside=True)
    assert any("config settings json editor autosave delay milliseconds: 900" in text for text in read.texts)


@pytest.mark.parametrize("line, bare", [
    ("export const STATUS_REFRESH_MS = 4500;", "STATUS_REFRESH_MS = 4500;"),
    ("const RETRY_LIMIT: number = 5;", "RETRY_LIMIT = 5;"),
    ("// limits export const SEARCH_DEBOUNCE_MS = 250;", "// limits SEARCH_DEBOUNCE_MS = 250;"),
    ("  grace_days INTEGER NOT NULL DEFAULT 7,", "  grace_days DEFAULT 7,"),
    ("  volume_pct NUMERIC(5, 2) DEFAULT 0.5", "  volume_pct DEFAULT 0.5"),
    ('  "grace_days" integer NOT NULL DEFAULT 7,', '  "grace_days" DEFAULT 7,'),    # not `NOT DEFAULT 7`
])
def test_a_declarations_syntax_leaves_its_name_and_value(line, bare):
    assert bare_declaration(line) == bare


@pytest.mark.parametrize("line", ["RECONNECT_JITTER_MS = 40", "  retention_days: 14", "CREATE TABLE loans (",
                                  "if (a == b) return;", "return a === b;", "Note: x = 5",
                                  "  private static final int POOL = 8;",
                                  "We agreed the p99 budget for checkout is 120 ms."])
def test_lines_that_declare_nothing_or_in_a_typed_language_stay_as_written(line):
    assert bare_declaration(line) == line


def test_the_signals_drop_a_declarations_syntax_only_when_asked(monkeypatch):
    block = _file_block("// limits\nexport const SEARCH_DEBOUNCE_MS = 250;")
    monkeypatch.setattr(recall_signals, "BARE_DECLARATIONS", False)
    words = line_key(block, words=True)
    monkeypatch.setattr(recall_signals, "BARE_DECLARATIONS", True)
    assert line_key(block, words=True) == f"{words}d{recall_signals.BARE_DECLARATIONS_VERSION}"
    assert line_key(block) == block.hash                                       # only with the words
    read = CountingEmbedder()
    line_vectors(read, [block], words=True)
    assert any(text.endswith("limits search debounce milliseconds = 250;") for text in read.texts)
    assert not any("export const" in text for text in read.texts)
