"""Issue 41, items 8 and 9, on the real window and the embedded model (offscreen): Markdown as people write it
renders as lists (nested ones nested), strikethrough and links in the message's QTextDocument; what the window
exports (one conversation from its context menu, or all of them into a folder, as Markdown) imports back with
the same messages and timestamps."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from PySide6.QtGui import QTextDocument, QTextListFormat

from app.messages import ChatMessage
from app.render import render_markdown, render_parts
from app.theme import apply_scheme
from app.widgets.chat_view import AutoHeightBrowser
from app.widgets.code_block import CodeBlockView
from evoke_engine.store.history import HistoryDB
from integration.test_app_gui import close_desk, open_desk, test_settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

# docs/screenshots/rendered-list.png is refreshed only on request (EVOKE_SCREENSHOTS=1): test runs leave the tree alone
SCREENSHOT = (Path(__file__).resolve().parents[2] / "docs" / "screenshots" if os.environ.get("EVOKE_SCREENSHOTS")
              else Path(tempfile.gettempdir()) / "evoke-screenshots") / "rendered-list.png"

REPLY = """Steps:
1. Install the tools
2. Build it:
   - run `make`
     - then `make test`
   - ~~run the old script~~
3. Read https://example.org/docs and <https://example.com/faq>

Intro
- a
- b

<b>not bold</b> <script>alert(1)</script>

```python
print("done")
```
"""

# (title, created_at, [(role, text, created_at)]) written to SQLite before the window opens
SEEDED = [
    ("Lists and links", 1_790_000_000.25,
     [("user", "How do I build it?", 1_790_000_001.5), ("assistant", REPLY, 1_790_000_009.75)]),
    ("Ports", 1_790_100_000.0,
     [("user", "Which port?\n\n", 1_790_100_002.0),
      ("assistant", "Port 4003:\n```ini\nport = 4003", 1_790_100_004.125)]),     # a reply stopped mid-fence
]


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    home = tmp_path_factory.mktemp("issue41-home")
    settings = test_settings(home)
    history = HistoryDB(settings.data_dir / "history.sqlite3")
    try:
        for n, (title, created, messages) in enumerate(SEEDED):
            history.create_conversation(f"seed{n}", title, "", now=created)
            for role, text, at in messages:
                history.add_message(f"seed{n}", role, text, now=at)
    finally:
        history.close()
    desk = open_desk(home, settings=settings)
    yield desk
    close_desk(desk)


def history_of(desk, conversation_id: str) -> list[tuple[str, str, float]]:
    return [(m.role, m.text, m.created_at) for m in desk.c.engine.history.messages(conversation_id)]


def lists_of(document: QTextDocument) -> list[tuple[str, int, str]]:
    """(style, indent, text) of every list item in the document, in order."""
    items = []
    block = document.begin()
    while block.isValid():
        if (text_list := block.textList()) is not None:
            style = text_list.format().style()
            items.append(("ordered" if style == QTextListFormat.Style.ListDecimal else "bullet",
                          text_list.format().indent(), block.text().strip()))
        block = block.next()
    return items


def fragments(document: QTextDocument) -> list[tuple[str, bool, str]]:
    """(text, struck out, link) of every text fragment."""
    out = []
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.isValid():
                fmt = fragment.charFormat()
                out.append((fragment.text(), fmt.fontStrikeOut(), fmt.anchorHref() if fmt.isAnchor() else ""))
            it += 1
        block = block.next()
    return out


# -- 9: Markdown as people write it ------------------------------------------------------------------------
def test_lists_nesting_strikethrough_and_autolinks_render_in_the_message(desk, qtbot, qapp):
    bubble = desk.w.chat.add(ChatMessage("assistant", REPLY))
    qtbot.wait_until(lambda: bubble.isVisible())
    texts = [w for w in bubble.parts if isinstance(w, AutoHeightBrowser) and w.isVisible()]
    codes = [w for w in bubble.parts if isinstance(w, CodeBlockView)]
    assert len(texts) == 1 and [c.code for c in codes] == ['print("done")']    # the fence keeps its own widget
    document = texts[0].document()
    items = lists_of(document)
    assert [text for _, _, text in items] == ["Install the tools", "Build it:", "run make", "then make test",
                                              "run the old script",
                                              "Read https://example.org/docs and https://example.com/faq", "a", "b"]
    styles = {text: (style, indent) for style, indent, text in items}
    assert styles["Install the tools"][0] == styles["Build it:"][0] == "ordered"     # "Steps:\n1. a" is a list
    assert styles["a"][0] == "bullet"                                                 # "Intro\n- a" too
    top, nested, deeper = styles["Build it:"][1], styles["run make"][1], styles["then make test"][1]
    assert top < nested < deeper and styles["run the old script"][1] == nested       # the nesting is kept
    pieces = fragments(document)
    assert any(struck and text == "run the old script" for text, struck, _ in pieces)
    links = {href for _, _, href in pieces if href}
    assert links == {"https://example.org/docs", "https://example.com/faq"}
    assert "<b>not bold</b> <script>alert(1)</script>" in texts[0].toPlainText()    # raw HTML stays text
    sheet, palette, theme = qapp.styleSheet(), qapp.palette(), qapp.property("evokeTheme")
    try:                                                  # the screenshot in the app's dark theme
        apply_scheme(qapp, "dark")
        desk.w.chat.ensureWidgetVisible(bubble)
        qtbot.wait(100)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert bubble.grab().save(str(SCREENSHOT))
    finally:
        qapp.setStyleSheet(sheet)                         # the application is shared with later modules
        qapp.setPalette(palette)
        qapp.setProperty("evokeTheme", theme)


def test_a_streaming_reply_becomes_a_list_as_its_items_arrive(desk, qtbot):
    chat = desk.w.chat
    bubble = chat.add(ChatMessage("assistant", ""))
    for so_far in ("Steps:\n1. a", "Steps:\n1. a\n2. b", "Steps:\n1. a\n2. b\n   - nested ~~gone~~"):
        chat.update_streaming(so_far)
    document = bubble.parts[0].document()
    items = lists_of(document)
    assert [(style, text) for style, _, text in items] == [("ordered", "a"), ("ordered", "b"),
                                                           ("bullet", "nested gone ▍")]
    assert any(struck and text == "gone" for text, struck, _ in fragments(document))


def test_the_renderer_keeps_code_in_lists_unsafe_links_and_images_out():
    parts = render_parts("1. Install:\n   ```sh\n   pip install x\n   ```\n2. Run [it](javascript:alert(1)) "
                         "![logo](/etc/passwd) ~~now~~\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    assert [p.kind for p in parts] == ["html"]                       # a fence inside a list item stays in the list
    html = parts[0].html
    assert "<ol>" in html and "<pre" in html and "install" in html and "<s>now</s>" in html and "<table" in html
    assert "javascript:" not in html.replace("[it](javascript:alert(1))", "") and "<img" not in html
    whole = render_markdown("Intro\n- a\n  ```py\n  x = 1\n  ```\n\n```\ny\n```")
    assert whole.code_blocks == ["x = 1", "y"] and 'href="copy:1"' in whole.html



def test_a_single_line_break_stays_a_line_break():
    html = render_markdown("Monday\nTuesday\n\nNext").html
    assert "Monday<br />" in html and "Tuesday" in html                # a chat's line break, not a soft break

# -- 8: export from the context menu, export all, import back ---------------------------------------------
def test_export_from_the_context_menu_then_import_gives_the_same_messages_and_times(desk, qtbot, tmp_path):
    sidebar = desk.w.sidebar
    qtbot.wait_until(lambda: "seed1" in sidebar.visible_ids())
    row = sidebar.visible_ids().index("seed1")
    menu = sidebar.menu_for(sidebar.proxy.index(row, 0))
    export = next(a for a in menu.actions() if a.text() == "Export…")
    suggested = []
    desk.w.save_export = lambda parent, name: suggested.append(name) or str(tmp_path / name)
    with qtbot.wait_signal(desk.c.exported, timeout=30_000):
        export.trigger()
    assert suggested == ["Ports.md"]
    exported = tmp_path / "Ports.md"
    assert "## User · " in exported.read_text(encoding="utf-8")
    before = desk.c.current_id
    desk.w.pick_import = lambda parent: [str(exported)]
    with qtbot.wait_signal(desk.c.messagesReset, timeout=30_000):
        desk.w.import_action.trigger()
    copy = desk.c.current_id
    assert copy not in (before, "seed1")
    assert history_of(desk, copy) == history_of(desk, "seed1") == [(r, t, at) for r, t, at in SEEDED[1][2]]
    assert [m.text for m in desk.c.messages] == [t for _, t, _ in SEEDED[1][2]]
    assert [m.created_at for m in desk.c.messages] == [at for _, _, at in SEEDED[1][2]]   # shown with their times
    assert desk.c.engine.history.get_conversation(copy).created_at == SEEDED[1][1]


def test_export_all_writes_a_file_per_conversation_and_each_imports_back(desk, qtbot, tmp_path):
    folder = tmp_path / "all"
    desk.w.pick_folder = lambda parent: str(folder)
    file_menu = next(a.menu() for a in desk.w.menuBar().actions() if a.text() == "&File")
    assert desk.w.export_all_action in file_menu.actions()
    with qtbot.wait_signal(desk.c.exported, timeout=30_000) as said:
        desk.w.export_all_action.trigger()
    history = desk.c.engine.history
    conversations = [row for row in history.list_conversations() if history.messages(row.id)]
    files = sorted(folder.glob("*.md"))
    assert len(files) == len(conversations) and f"({len(conversations)} conversations)" in said.args[0]
    originals = {row.id for row in history.list_conversations()}
    desk.w.pick_import = lambda parent: [str(p) for p in files]
    with qtbot.wait_signal(desk.c.messagesReset, timeout=60_000):
        desk.w.import_action.trigger()
    copies = [row for row in history.list_conversations() if row.id not in originals]
    assert len(copies) == len(files)
    for title, created, messages in SEEDED:
        copy = next(row for row in copies if row.title == title)
        assert copy.created_at == created
        assert history_of(desk, copy.id) == list(messages)
