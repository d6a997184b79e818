"""The Markdown export on plain rows: a stopped reply's open code fence is closed, closed ones are left alone; what
the export writes (Markdown or JSON, one conversation or all) imports back with its messages' timestamps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from evoke_engine.conversations.exchange import (
    close_open_fences,
    export_file_name,
    parse_conversation,
    store_imported,
    to_json,
    to_markdown,
    write_all,
)
from evoke_engine.errors import ImportFormatError
from evoke_engine.store.history import ConversationRow, HistoryDB, MessageRow

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


def _row(role: str, text: str, i: int) -> MessageRow:
    return MessageRow(id=i, conversation_id="c", role=role, text=text, attachments=[], created_at=0.0)


def test_a_stopped_replys_open_fence_is_closed_in_the_export():
    conversation = ConversationRow("c", "Lists", 0.0, 0.0, False, "", {})
    stopped = "Here:\n\n```python\nclass Node:\n    def __init__(self"
    markdown = to_markdown(conversation, [_row("user", "A linked list?", 1), _row("assistant", stopped, 2),
                                          _row("user", "Thanks", 3)])
    body = markdown.split("## Assistant", 1)[1].split("## User", 1)[0]
    assert body.count("```") == 2
    assert markdown.split("## User")[-1].split("\n", 1)[1].strip() == "Thanks"     # after "## User · <time>"


def test_closed_fences_and_longer_openers_are_respected():
    closed = "```\na\n```\nafter"
    assert close_open_fences(closed) == closed
    assert close_open_fences("````md\n```\ninner\n```\n") == "````md\n```\ninner\n```\n````"
    assert close_open_fences("~~~\nx") == "~~~\nx\n~~~"
    assert close_open_fences("no code") == "no code"


# -- issue 41, item 8: what the app exports imports back, timestamps kept --------------------------------------
TRICKY = [
    ("user", "Steps:\n1. a\n2. b", [("notes.md", "# Notes\n```sh\nmake\n```\n")], {}),
    ("assistant", "\nIt starts with a blank line and ends with spaces.  \n\n", [], {"tokens": 12, "interrupted": True}),
    ("user", "## User\nis a heading inside my message, and so is\n<!-- a comment -->", [("a.txt", "no newline")], {}),
    ("assistant", "Here:\n\n```python\nclass Node:\n    def __init__(self", [], {"stopped": "user"}),
    ("tool", '{"result": "--> done"}', [], {"name": "search"}),
]


def _rows(specs, start=1_700_000_000.123456) -> list[MessageRow]:
    return [MessageRow(id=i, conversation_id="c", role=role, text=text, attachments=attachments,
                       created_at=start + 61.5 * i, extra=extra)
            for i, (role, text, attachments, extra) in enumerate(specs)]


def _conversation(**settings) -> ConversationRow:
    return ConversationRow("c", "Lists and <code>", 1_699_999_999.5, 1_700_000_100.0, False,
                           "Be brief.\n\nAnswer in English --> always.", settings)


def _same(imported, rows) -> None:
    assert [(m.role, m.text, m.attachments, m.extra, m.created_at) for m in imported.messages] == \
        [(r.role, r.text, r.attachments, r.extra, r.created_at) for r in rows]


def test_the_markdown_export_imports_back_with_every_message_its_time_and_attachments():
    rows = _rows(TRICKY)
    tools = [{"type": "function", "function": {"name": "search", "description": "finds -> things --> fast"}}]
    conversation = _conversation(tools=tools)
    markdown = to_markdown(conversation, rows)
    assert "## User · " in markdown and "**Attached:** `notes.md`" in markdown   # still a file to read
    imported = parse_conversation(markdown)
    _same(imported, rows)
    assert (imported.title, imported.system_prompt, imported.tools, imported.created_at) == \
        (conversation.title, conversation.system_prompt, tools, conversation.created_at)
    assert to_markdown(conversation, rows) == markdown                               # export is deterministic


def test_the_json_export_imports_back_with_its_timestamps():
    rows = _rows(TRICKY)
    imported = parse_conversation(to_json(_conversation(), rows))
    _same(imported, rows)
    assert imported.created_at == _conversation().created_at


def test_markdown_without_the_comments_imports_by_its_headings():
    older = ("# Old chat\n\n> **System:** Be brief.\n> Really.\n\n"
             "## User\n\n**Attached:** `a.py`\n\n```\nprint(1)\n```\n\n"
             "What does it print?\n\n## Assistant · 2026-11-26 10:00:00 +0000\n\nIt prints 1:\n```\n## User\n```\n")
    imported = parse_conversation(older)
    assert imported.title == "Old chat" and imported.system_prompt == "Be brief.\nReally."
    assert [(m.role, m.text, m.attachments) for m in imported.messages] == [
        ("user", "What does it print?", [("a.py", "print(1)")]),
        ("assistant", "It prints 1:\n```\n## User\n```", [])]
    assert imported.messages[0].created_at is None                 # timed at the import
    assert imported.messages[1].created_at == datetime(2026, 11, 26, 10, tzinfo=UTC).timestamp()   # the heading's


@pytest.mark.parametrize("bad, reason", [("just some notes\n", "no \"## User\""),
                                         ("<!-- evoke-desk:message {\"role\": \"bot\"} -->\nhi\n", "needs a role"),
                                         ("<!-- evoke-desk:message {nope} -->\nhi\n", "damaged")])
def test_a_markdown_file_that_is_no_conversation_says_why(bad, reason):
    with pytest.raises(ImportFormatError, match=reason):
        parse_conversation(bad)


def test_export_all_writes_one_file_each_and_every_file_imports_back_the_same(tmp_path):
    source = HistoryDB(tmp_path / "source.sqlite3")
    target = HistoryDB(tmp_path / "target.sqlite3")
    try:
        for n, title in enumerate(["Ports", "Ports", "a/b: c?"]):
            source.create_conversation(f"c{n}", title, "", now=1_700_000_000.0 + n)
            for i, (role, text, attachments, extra) in enumerate(TRICKY[:3]):
                source.add_message(f"c{n}", role, f"{text} {n}", attachments, now=1_700_000_000.25 + 100 * n + i,
                                   extra=extra)
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "2023-11-14 Ports.md").write_text("kept")     # a file already there keeps its name
        paths = write_all(source, tmp_path / "out")
        assert len(paths) == 3 and len({p.name for p in paths}) == 3 and all(p.suffix == ".md" for p in paths)
        assert (tmp_path / "out" / "2023-11-14 Ports.md").read_text() == "kept"
        for path in paths:
            store_imported(target, path.stem, parse_conversation(path.read_text(encoding="utf-8")),
                           {"imported": True}, now=1_800_000_000.0)
        by_title = {}
        for row in target.list_conversations():
            by_title.setdefault(row.title, []).append(row)
        for original in source.list_conversations():
            copy = next(r for r in by_title[original.title] if target.messages(r.id)[0].text.endswith(
                str(int(original.id[1:]))))
            assert copy.created_at == original.created_at and copy.updated_at == 1_800_000_000.0   # listed first
            assert [(m.role, m.text, m.attachments, m.extra, m.created_at) for m in target.messages(copy.id)] == \
                [(m.role, m.text, m.attachments, m.extra, m.created_at) for m in source.messages(original.id)]
    finally:
        source.close()
        target.close()


def test_export_file_names_are_dated_safe_and_unique():
    taken: set[str] = set()
    names = [export_file_name(t, 1_700_000_000.0, taken) for t in ("Ports", "ports", "../etc/passwd", "")]
    assert len(set(names)) == 4 and all("/" not in n and n.endswith(".md") for n in names)
    assert names[1].endswith("(2).md")
