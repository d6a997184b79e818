"""App logic without the model: Markdown rendering, settings form, attachments, models, scheduler."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from helpers.ui_waits import UI_WAIT_MS
from PySide6.QtCore import Qt

from app import settings_form as form
from app.attachments import AttachmentError, is_large_paste, paste_name, read_text_attachment
from app.item_models import BlockTableModel, ConversationListModel, EventLogModel, GeneratingRole
from app.model_finder import find_models
from app.render import Part, render_markdown, render_parts
from evoke_engine.settings import Settings

pytestmark = pytest.mark.qt_log_level_fail("WARNING")


# -- rendering ---------------------------------------------------------------------------------
def test_fenced_code_is_highlighted_with_a_copy_link_per_block():
    text = "Intro **bold**\n\n```python\ndef f():\n    return 1 < 2\n```\nmiddle\n\n```\nplain\n```\n"
    rendered = render_markdown(text)
    assert rendered.code_blocks == ["def f():\n    return 1 < 2", "plain"]
    assert 'href="copy:0"' in rendered.html and 'href="copy:1"' in rendered.html
    assert "<strong>bold</strong>" in rendered.html
    assert "color: #" in rendered.html                      # pygments inline styles
    assert "&lt;" in rendered.html


def test_unclosed_fence_while_streaming_renders_as_code():
    parts = render_parts("Here:\n```js\nlet x = 1")
    assert [(p.kind, p.code, p.lang) for p in parts] == [("html", "", ""), ("code", "let x = 1", "js")]
    assert isinstance(parts[0], Part) and "Here:" in parts[0].html
    assert render_markdown("Here:\n```js\nlet x = 1").code_blocks == ["let x = 1"]


def test_raw_html_in_a_message_is_shown_as_text():
    html = render_markdown("<script>alert(1)</script> and <b>x</b>").html
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>" not in html


# -- settings form -----------------------------------------------------------------------------
def test_every_declared_setting_has_a_field_with_a_valid_default():
    specs = form.field_specs(Settings)
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    assert {d["name"] for d in Settings.describe()} == set(names)
    defaults = Settings()
    for spec in specs:
        assert spec.check(getattr(defaults, spec.name)) is None, spec.name
        assert spec.default_text.startswith("default: ")
        assert spec.applies_text in ("applies now", "after model reload")
        assert form.from_editor(spec, form.to_editor(spec, spec.default)) == spec.default, spec.name
    groups = form.grouped(specs)
    assert {"Model", "Memory", "Persistence", "Conversation"} <= set(groups)
    assert {s.name for s in groups["Memory"]} >= {"budget_tokens", "high_watermark", "low_watermark", "block_tokens",
                                                 "recovery", "recovery_top_k", "ram_budget_bytes", "embedder"}


def test_build_validates_ranges_and_cross_field_rules():
    specs = form.field_specs(Settings)
    base = Settings(home="/tmp/unused")
    assert form.build(base, {"budget_tokens": 512}, specs).budget_tokens == 512
    with pytest.raises(ValueError, match="Budget"):
        form.build(base, {"budget_tokens": 10}, specs)
    with pytest.raises(ValueError, match="low_watermark"):
        form.build(base, {"low_watermark": 0.95, "high_watermark": 0.9}, specs)
    now, reload = form.changed(base, base.replace(budget_tokens=512, n_ctx=4096), specs)
    assert now == ["budget_tokens"] and reload == ["n_ctx"]


def test_bytes_are_edited_in_mib_and_formatted_for_people():
    spec = next(s for s in form.field_specs(Settings) if s.name == "ram_budget_bytes")
    assert spec.kind == "bytes" and form.to_editor(spec, 2 << 30) == 2048
    assert form.from_editor(spec, 512) == 512 << 20
    assert spec.format(2 << 30) == "2 GiB"


# -- attachments -------------------------------------------------------------------------------
def test_text_files_attach_and_binary_or_missing_files_are_refused(tmp_path):
    good = tmp_path / "notes.md"
    good.write_text("# hi\n", encoding="utf-8")
    assert read_text_attachment(good) == ("notes.md", "# hi\n")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02" * 10)
    with pytest.raises(AttachmentError, match="binary"):
        read_text_attachment(binary)
    with pytest.raises(AttachmentError, match="missing.txt"):
        read_text_attachment(tmp_path / "missing.txt")


def test_large_paste_detection_and_names():
    assert not is_large_paste("short")
    assert is_large_paste("x\n" * 50)
    assert paste_name("import os\n", set()) == "pasted-1.py"
    assert paste_name("hello", {"pasted-1.txt"}) == "pasted-2.txt"


def test_model_finder_lists_the_embedded_model_first_and_finds_gguf_files(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "coder-7b.Q4_K_M.gguf").write_bytes(b"GGUF" + b"\0" * 16)
    (tmp_path / "a" / "mmproj-x.gguf").write_bytes(b"GGUF")
    models = find_models(roots=[("test", tmp_path)])
    assert models[0].path is None and "embedded" in models[0].label.lower()
    assert [m.path.rsplit("/", 1)[-1] for m in models[1:]] == ["coder-7b.Q4_K_M.gguf"]


# -- item models -------------------------------------------------------------------------------
def test_conversation_list_orders_pinned_first_then_by_last_use(qapp):
    model = ConversationListModel()
    info = lambda i, t, u, p: SimpleNamespace(id=i, title=t, updated_at=u, pinned=p, memory="disk")  # noqa: E731
    model.set_conversations([info("a", "old", 1.0, False), info("b", "new", 3.0, False),
                             info("c", "pinned", 0.5, True)])
    assert [r.id for r in model.rows] == ["c", "b", "a"]
    assert model.row_of("a") == 2


def test_a_new_conversation_is_listed_at_once_first_after_the_pinned_and_marked_while_it_writes(qapp):
    model = ConversationListModel()
    info = lambda i, u, p: SimpleNamespace(id=i, title=i, updated_at=u, pinned=p, memory="disk")  # noqa: E731
    model.set_conversations([info("a", 1.0, False), info("pinned", 0.5, True)])
    model.set_generating({"new"})                     # its reply started before the row was listed
    inserted = []
    model.rowsInserted.connect(lambda _parent, first, last: inserted.append((first, last)))
    model.show_new("new", "New conversation", 5.0)
    assert [r.id for r in model.rows] == ["pinned", "new", "a"] and inserted == [(1, 1)]
    assert model.data(model.index(1), GeneratingRole)
    model.show_new("new", "again", 6.0)               # listed already: nothing changes
    assert len(model.rows) == 3 and inserted == [(1, 1)]
    model.set_conversations([info("a", 1.0, False), info("pinned", 0.5, True), info("new", 5.0, False)])
    assert [r.id for r in model.rows] == ["pinned", "new", "a"]      # the engine's list puts it where it was


def test_block_model_follows_events_and_sums_tokens_by_state(qapp):
    model = BlockTableModel()
    model.set_blocks([{"name": "system", "state": "resident", "tokens": 40, "shared": True},
                      {"name": "user#1", "state": "resident", "tokens": 10}])
    assert model.set_state("user#1", "ram") and not model.set_state("nope", "ram")
    assert model.tokens_by_state() == {"resident": 40, "ram": 10, "disk": 0, "dropped": 0}
    log = EventLogModel(limit=2)
    for i in range(3):
        log.append("evicted", f"evicted user#{i}")
    assert log.texts() == ["evicted user#1", "evicted user#2"]


def test_block_model_shows_an_attention_column_only_while_attention_is_captured(qapp):
    model = BlockTableModel()
    model.set_blocks([{"name": "user#1", "state": "resident", "tokens": 10}])
    assert model.columnCount() == 4
    model.set_blocks([{"name": "system", "state": "resident", "tokens": 40, "shared": True, "attention": None},
                      {"name": "file:a.txt#1", "state": "ram", "tokens": 64, "attention": 0.25},
                      {"name": "user#2", "state": "resident", "tokens": 10, "attention": 1.0}])
    assert model.columnCount() == 5 and model.headerData(4, Qt.Orientation.Horizontal) == "Attention"
    assert [model.data(model.index(row, 4)) for row in range(3)] == ["", "0.25", "1.00"]


# -- scheduler ---------------------------------------------------------------------------------
def test_scheduler_wakes_in_the_qt_loop_even_when_jobs_are_added_off_thread(qtbot):
    from app.qt_scheduler import QtEventLoopScheduler

    wakeups: list[threading.Thread] = []

    class Probe(QtEventLoopScheduler):
        def _process_jobs(self):
            wakeups.append(threading.current_thread())
            return super()._process_jobs()

    scheduler = Probe()
    scheduler.start()
    ran: list[threading.Thread] = []
    try:
        adder = threading.Thread(target=lambda: scheduler.add_job(lambda: ran.append(threading.current_thread()),
                                                                  "date"))
        adder.start()
        adder.join()
        qtbot.wait_until(lambda: bool(ran), timeout=UI_WAIT_MS)
        assert wakeups and all(t is threading.main_thread() for t in wakeups)   # timer on the GUI thread
        assert ran[0] is not threading.main_thread()                           # jobs in the executor pool
    finally:
        scheduler.shutdown(wait=False)


# -- binding work-around -----------------------------------------------------------------------
def test_many_python_side_emits_cannot_exhaust_true(qapp):
    import sys

    from app import qtcompat

    qtcompat.guard_true_refcount()
    leak = qtcompat.true_refcount_leak_per_emit()
    assert leak == 0 or sys.getrefcount(True) > 1 << 39     # PySide6 6.12 on 3.11: padded


def test_titles_come_from_the_first_line_or_the_first_attachment():
    from app.messages import title_from

    assert title_from("\n  Fix the parser bug\nmore", []) == "Fix the parser bug"
    assert title_from("word " * 30, []).endswith("…") and len(title_from("word " * 30, [])) <= 49
    assert title_from("", [("notes.md", 10)]) == "notes.md"


def test_stall_probe_reports_gaps_beyond_the_tick(qapp):
    from benchmarks.gui_latency import StallProbe

    probe = StallProbe()
    probe.gaps["turn"] = [10.0] * 98 + [70.0, 12.0]
    summary = probe.summary("turn")
    assert summary["ticks"] == 100 and summary["stall_max_ms"] == 60.0 and summary["stalls_over_50ms"] == 1
    assert summary["stall_p50_ms"] == 0.0 and probe.summary("missing") == {"ticks": 0}
