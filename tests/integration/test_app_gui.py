"""The window on the real engine and the embedded model (offscreen): stream, stop, keys, attach,
budget, conversations, a bad model path, and no llama.cpp call on the GUI thread."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from helpers.ui_waits import UI_WAIT_MS
from PySide6.QtCore import QMimeData, Qt, QUrl
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QDialogButtonBox, QToolButton

from app.__main__ import build
from app.messages import Stream
from evoke_engine import Settings

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]
REPLY_MS = 120_000


def wait_for(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        QTest.qWait(20)


def test_settings(home) -> Settings:
    return Settings(home=str(home), embedder="off", tools_enabled=False, max_tokens=24, temperature=0.0,
                    budget_tokens=1024, n_ctx=4096, slots=3, n_threads=1)


test_settings.__test__ = False   # a helper, not a test


@pytest.fixture(scope="module")
def llama_threads():
    """Counts llama.cpp calls per thread name for every engine this module creates."""
    import llama_cpp as ll

    calls: Counter[str] = Counter()
    patch = pytest.MonkeyPatch()

    def recording(fn):
        def wrapper(*args, **kwargs):
            calls[threading.current_thread().name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in dir(ll):
        obj = getattr(ll, name)
        if name.startswith("llama_") and callable(obj) and not isinstance(obj, type):
            patch.setattr(ll, name, recording(obj))
    yield calls
    patch.undo()


def open_desk(home, size=(1200, 800), settings: Settings | None = None):
    bridge, controller, window = build(settings or test_settings(home), size)
    window.show()
    controller.start()
    wait_for(lambda: controller.model_state == "ready" and controller.settled)   # no chat-view reset follows
    return SimpleNamespace(bridge=bridge, c=controller, w=window, home=home)


def close_desk(desk) -> None:
    desk.w.close()
    desk.bridge.close()


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory, llama_threads):
    desk = open_desk(tmp_path_factory.mktemp("desk-home"))
    yield desk
    close_desk(desk)


def fresh_conversation(desk, qtbot) -> str:
    old = desk.c.current_id
    with qtbot.wait_signal(desk.c.currentChanged, timeout=REPLY_MS):
        qtbot.mouseClick(desk.w.sidebar.new_button, Qt.MouseButton.LeftButton)
    assert desk.c.current_id != old
    qtbot.wait_until(lambda: desk.c.settled and not desk.c.stats_pending, timeout=REPLY_MS)
    return desk.c.current_id


def send_and_wait(desk, qtbot, text: str, **options):
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as reply:
        assert desk.c.send(text, **options)
    qtbot.wait_until(lambda: not desk.c.stats_pending and not desk.c.generating)
    return reply.args[0]


# -- chatting ----------------------------------------------------------------------------------
def test_a_message_streams_token_by_token_and_completes(desk, qtbot):
    fresh_conversation(desk, qtbot)
    pieces, progress = [], []
    desk.bridge.token.connect(lambda _cid, piece: pieces.append(piece))
    desk.c.replyProgress.connect(progress.append)
    desk.w.input.prompt.setPlainText("Name three primary colors.")
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as done:
        qtbot.keyClick(desk.w.input.prompt, Qt.Key.Key_Return)
        assert desk.w.input.stop_button.isVisibleTo(desk.w) and desk.w.input.prompt.toPlainText() == ""
    message = done.args[0]
    assert len(pieces) >= 3 and message.text == "".join(pieces)
    assert progress and all(message.text.startswith(p) for p in progress)     # partial replies grew
    assert desk.w.chat.bubbles[-2].text().strip() == "Name three primary colors."
    assert desk.w.chat.last_text().strip()
    assert "tok/s" in message.meta and desk.w.status.speed.text().endswith("tok/s")
    assert desk.w.input.send_button.isVisibleTo(desk.w)


def test_stop_cancels_mid_reply_and_keeps_the_partial_text(desk, qtbot):
    fresh_conversation(desk, qtbot)
    with qtbot.wait_signal(desk.c.replyProgress, timeout=REPLY_MS):
        assert desk.c.send("Write a long story about a robot who learns to paint.", max_tokens=400)
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as done:
        qtbot.mouseClick(desk.w.input.stop_button, Qt.MouseButton.LeftButton)
    message = done.args[0]
    assert message.stopped == "cancelled" and message.text.strip()
    assert "stopped" in message.meta
    history = desk.bridge.call(desk.c.conv.messages).result(timeout=30)
    assert history[-1]["role"] == "assistant" and history[-1]["text"] == message.text
    assert not desk.c.generating and desk.w.input.send_button.isVisibleTo(desk.w)


def test_enter_sends_and_shift_enter_adds_a_line(desk, qtbot):
    fresh_conversation(desk, qtbot)
    prompt = desk.w.input.prompt
    with qtbot.assert_not_emitted(desk.c.messageAdded, wait=100):
        qtbot.keyClicks(prompt, "first line")
        qtbot.keyClick(prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
        qtbot.keyClicks(prompt, "second line")
    assert prompt.toPlainText() == "first line\nsecond line"
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS):
        qtbot.keyClick(prompt, Qt.Key.Key_Enter)
    assert desk.c.messages[-2].text == "first line\nsecond line"
    assert prompt.toPlainText() == ""


def test_a_paused_draft_goes_to_the_engine_before_enter(desk, qtbot, monkeypatch):
    """Issue 44: typing paused, the stripped draft and the pending attachments go to `Engine.prepare_ahead` for the
    open conversation (which embeds it and works out its input and recovery on idle time, so the turn that sends it
    waits for neither: test_prepare_ahead.py); typing on restarts the pause."""
    fresh_conversation(desk, qtbot)
    handed: list[tuple] = []
    monkeypatch.setattr(desk.c.engine, "prepare_ahead", lambda *args: handed.append(args))
    prompt = desk.w.input.prompt
    with qtbot.wait_signal(desk.w.input.draftSettled, timeout=UI_WAIT_MS) as settled:
        qtbot.keyClicks(prompt, "  which notes did I keep?  ")
    assert settled.args == ["  which notes did I keep?  "]
    qtbot.wait_until(lambda: handed == [(desk.c.current_id, "which notes did I keep?", [])], timeout=UI_WAIT_MS)
    prompt.clear()


def test_a_short_pause_in_typing_starts_the_drafts_vector(desk, qtbot, monkeypatch):
    """Issue 44: at each short pause (`DRAFT_EMBED_MS`, well before the draft settles) the stripped draft goes to
    `Engine.embed_draft`, so an Enter right after the last keystroke finds its vector on its way; not while a
    reply streams."""
    fresh_conversation(desk, qtbot)
    started: list[str] = []
    monkeypatch.setattr(desk.c.engine, "embed_draft", started.append)
    prompt = desk.w.input.prompt
    with qtbot.wait_signal(desk.w.input.draftTyped, timeout=UI_WAIT_MS) as typed:
        qtbot.keyClicks(prompt, "  where is the flag set?  ")
    assert typed.args == ["  where is the flag set?  "]
    qtbot.wait_until(lambda: started == ["where is the flag set?"], timeout=UI_WAIT_MS)
    monkeypatch.setattr(desk.c, "streams", {"elsewhere": Stream("elsewhere", 0.0)})   # a reply streams somewhere
    desk.c.draft_typed("and where is it read?")
    qtbot.wait(300)                                      # (the hand-off runs on the bridge's call thread)
    assert started == ["where is the flag set?"]
    prompt.clear()


def test_a_large_paste_offers_to_attach_it_as_a_file(desk, qtbot):
    prompt, big = desk.w.input.prompt, "\n".join(f"line {i}: value = {i * i}" for i in range(80))
    prompt.clear()
    mime = QMimeData()
    mime.setText(big)
    desk.w.confirm = lambda *args: False                  # "no": it goes into the box as text
    prompt.insertFromMimeData(mime)
    assert prompt.toPlainText() == big and desk.c.pending == []
    prompt.clear()
    desk.w.confirm = lambda *args: True                   # "attach as file"
    prompt.insertFromMimeData(mime)
    assert prompt.toPlainText() == "" and desk.c.pending == [("pasted-1.txt", big)]
    assert len(desk.w.input.chips) == 1
    qtbot.mouseClick(desk.w.input.chips[0].findChild(QToolButton), Qt.MouseButton.LeftButton)
    assert desk.c.pending == [] and desk.w.input.chips == []
    small = QMimeData()
    small.setText("short text")
    prompt.insertFromMimeData(small)
    assert prompt.toPlainText() == "short text"
    prompt.clear()


def test_copy_link_puts_the_code_block_on_the_clipboard(desk, qtbot):
    from PySide6.QtGui import QGuiApplication

    from app.messages import ChatMessage
    from app.widgets.chat_view import MessageBubble

    bubble = MessageBubble(ChatMessage("assistant", "Use:\n```python\nprint('hi')\n```\nor\n```sh\necho hi\n```",
                                       meta="9 tokens · 30.0 tok/s"))
    qtbot.addWidget(bubble)
    qtbot.mouseClick(bubble.code_views()[1].copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "echo hi" and "Copied" in bubble.code_views()[1].copy_button.text()
    assert bubble.footer.text() == "9 tokens · 30.0 tok/s"                 # the reply's footer stays


# -- memory ------------------------------------------------------------------------------------
def long_file(tmp_path, name="service_notes.txt", sections=14):
    lines = [f"Section {i}: the {name} service keeps {i * 7} workers on port {4000 + i}, restarts after "
             f"{i + 3} failures and logs to /var/log/svc{i}.log with rotation every {i + 1} days."
             for i in range(sections)]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_an_attached_file_shows_as_blocks_in_the_memory_panel(desk, qtbot, tmp_path):
    fresh_conversation(desk, qtbot)
    notes = long_file(tmp_path)
    desk.w.pick_files = lambda parent: [str(notes)]
    qtbot.mouseClick(desk.w.input.attach_button, Qt.MouseButton.LeftButton)
    assert len(desk.w.input.chips) == 1
    dropped = long_file(tmp_path, "dropped.md", 3)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(dropped))])
    desk.w.input.prompt.insertFromMimeData(mime)                 # what a drop or a file paste does
    assert [n for n, _ in desk.c.pending] == ["service_notes.txt", "dropped.md"]
    prefill: list[tuple[int, str]] = []
    desk.c.prefillProgress.connect(lambda done, text: prefill.append((done, text)))
    with qtbot.wait_signal(desk.c.statsChanged, timeout=REPLY_MS,
                           check_params_cb=lambda s: s.get("turn", 0) >= 1):
        send_and_wait(desk, qtbot, "Which port does section 3 use?")
    assert prefill and prefill[-1][1].count("/") == 1                  # long prefill showed progress
    names = [name for name, _, _ in desk.w.memory.block_rows()]
    assert "file:service_notes.txt#0" in names and "file:service_notes.txt#1" in names
    assert "file:dropped.md#0" in names and "user#1" in names and "assistant#1" in names
    assert desk.w.input.chips == [] and "service_notes.txt" in desk.w.chat.bubbles[-2].chips.text()


def test_a_file_block_menu_keeps_its_file_in_context_until_let_go(desk, qtbot, tmp_path):
    """Issue 46: what the user attached stays in context until they say otherwise, from the memory panel."""
    fresh_conversation(desk, qtbot)
    desk.c.attach_file(str(long_file(tmp_path, "kept.txt", 8)))
    send_and_wait(desk, qtbot, "Summarize the file.")
    send_and_wait(desk, qtbot, "Now tell me a short joke about compilers, please.")
    errors: list[str] = []
    desk.c.errorRaised.connect(errors.append)
    panel, model = desk.w.memory, desk.c.blocks
    rows = [i for i, r in enumerate(model.rows) if r.file_name == "kept.txt"]
    assert rows and panel.file_actions(rows[0]) == [("Keep kept.txt in context", True)]
    assert panel.file_actions(next(i for i, r in enumerate(model.rows) if r.role == "user")) == []

    def file_rows():
        return [r for r in model.rows if r.file_name == "kept.txt"]
    panel.keepFileAsked.emit("kept.txt", True)
    qtbot.wait_until(lambda: errors or all(r.pinned and r.state == "resident" for r in file_rows()),
                     timeout=REPLY_MS)
    assert errors == []
    assert panel.file_actions(rows[0]) == [("Let kept.txt leave the context", False)]
    assert model.data(model.index(rows[0], 2)).endswith("· kept")
    send_and_wait(desk, qtbot, "And another short joke, about caches this time.")
    assert all(r.pinned and r.state == "resident" for r in file_rows())
    panel.keepFileAsked.emit("kept.txt", False)
    qtbot.wait_until(lambda: not any(r.pinned for r in file_rows()), timeout=REPLY_MS)


def test_lowering_the_budget_in_settings_evicts_and_the_gauge_stays_within_it(desk, qtbot, tmp_path):
    fresh_conversation(desk, qtbot)
    desk.c.attach_file(str(long_file(tmp_path, "big.txt", 18)))
    send_and_wait(desk, qtbot, "Summarize the file.")
    assert int(desk.c.stats.active_tokens) > 600
    evictions_before = int(desk.c.stats.evictions)
    events_before = len(desk.c.events.texts())
    dialog = desk.w.open_settings()
    assert dialog.spec("budget_tokens").applies_text == "applies now"
    dialog.set_value("budget_tokens", 256)
    with qtbot.wait_signal(desk.c.settingsApplied, timeout=REPLY_MS):
        qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
    qtbot.wait_until(lambda: desk.c.stats is not None and desk.c.stats.budget_tokens == 256
                     and not desk.c.stats_pending, timeout=30_000)
    assert not dialog.isVisible()
    assert int(desk.c.stats.evictions) > evictions_before
    assert any(text.startswith("evicted file:big.txt#") for text in desk.c.events.texts()[events_before:])
    states = {state for _, _, state in desk.w.memory.block_rows()}
    assert "ram" in states and int(desk.w.memory.counts()["evictions"]) > 0
    assert desk.w.status.budget == 256 and desk.w.status.active <= 256
    send_and_wait(desk, qtbot, "And what is on the last line?")
    assert desk.w.status.active <= 256
    saved = json.loads((desk.home / "config" / "settings.json").read_text())
    assert saved["budget_tokens"] == 256


def test_status_bar_and_settings_show_the_device_the_model_runs_on(desk, qtbot):
    info = desk.c.model_info
    expected = "CPU" if info.device_kind == "cpu" and not info.device_notice else None
    if expected:
        assert desk.w.status.device.text() == "CPU"
    assert info.device in desk.w.status.device.toolTip()
    dialog = desk.w.open_settings()
    assert dialog.device_info.text().startswith(f"Device: {info.device}")
    dialog.reject()


def test_a_bad_budget_is_refused_in_the_dialog(desk, qtbot):
    dialog = desk.w.open_settings()
    dialog.set_value("low_watermark", 0.95)
    dialog.set_value("high_watermark", 0.9)
    with qtbot.assert_not_emitted(dialog.applied):
        qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Apply), Qt.MouseButton.LeftButton)
    assert dialog.isVisible() and "low_watermark" in dialog.error.text()
    dialog.reject()


# -- conversations -----------------------------------------------------------------------------
def test_new_rename_pin_search_switch_and_delete_conversations(desk, qtbot):
    first = fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Say hello.")
    second = fresh_conversation(desk, qtbot)
    assert desk.w.chat.bubbles == []
    send_and_wait(desk, qtbot, "Say hi.")                       # an empty conversation is dropped when left
    qtbot.wait_until(lambda: desk.w.sidebar.visible_ids()[:2] == [second, first])
    desk.w.ask_text = lambda *args: "Greeting chat"
    desk.w.rename_conversation(first)
    qtbot.wait_until(lambda: "Greeting chat" in desk.w.sidebar.visible_titles())
    desk.c.pin_conversation(first, True)
    qtbot.wait_until(lambda: desk.w.sidebar.visible_ids()[0] == first)
    desk.w.sidebar.search.setText("greeting")
    assert desk.w.sidebar.visible_titles() == ["Greeting chat"]
    desk.w.sidebar.search.clear()
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):              # switch back by click
        rect = desk.w.sidebar.view.visualRect(desk.w.sidebar.proxy.index(0, 0))
        qtbot.mouseClick(desk.w.sidebar.view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert desk.c.current_id == first and desk.w.title.text() == "Greeting chat"
    assert [b.role for b in desk.w.chat.bubbles] == ["user", "assistant"]
    desk.w.confirm = lambda *args: False
    desk.w.delete_conversation(second)
    QTest.qWait(200)
    assert second in desk.w.sidebar.visible_ids()
    desk.w.confirm = lambda *args: True
    desk.w.delete_conversation(second)
    qtbot.wait_until(lambda: second not in desk.w.sidebar.visible_ids())


def test_history_survives_closing_and_reopening_the_window(qapp, qtbot, tmp_path, llama_threads):
    first = open_desk(tmp_path)
    try:
        send_and_wait(first, qtbot, "Remember the word banana.")
        conversation_id, reply = first.c.current_id, first.c.messages[-1].text
        first.w.ask_text = lambda *args: "Fruit talk"
        first.w.rename_conversation(conversation_id)
        qtbot.wait_until(lambda: "Fruit talk" in first.w.sidebar.visible_titles())
    finally:
        close_desk(first)
    second = open_desk(tmp_path)
    try:
        qtbot.wait_until(lambda: len(second.w.chat.bubbles) == 2, timeout=30_000)
        assert second.c.current_id == conversation_id and second.w.title.text() == "Fruit talk"
        assert second.w.sidebar.visible_titles() == ["Fruit talk"]
        assert [m.text for m in second.c.messages] == ["Remember the word banana.", reply]
        qtbot.wait_until(lambda: "kv_restored" in [row.kind for row in second.c.events.rows])  # shown, then opened
        send_and_wait(second, qtbot, "What word did I ask you to remember?")
        assert len(second.w.chat.bubbles) == 4
    finally:
        close_desk(second)


def test_a_corrupt_cache_file_is_rebuilt_from_history_and_noted_in_the_event_list(qapp, qtbot, tmp_path):
    first = open_desk(tmp_path)
    try:
        send_and_wait(first, qtbot, "Remember the number seven.")
        conversation_id = first.c.current_id
    finally:
        close_desk(first)
    cache_files = [p for p in (tmp_path / "cache").rglob(f"*{conversation_id}*") if p.is_file()]
    assert cache_files, "the engine wrote no KV file on close"
    for path in cache_files:
        data = bytearray(path.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
        path.write_bytes(bytes(data))
    second = open_desk(tmp_path)
    try:
        qtbot.wait_until(lambda: len(second.w.chat.bubbles) == 2, timeout=30_000)
        qtbot.wait_until(lambda: any(t.startswith("cache file") or "rebuilt" in t for t in second.c.events.texts()))
        assert second.w.banner.text() == ""                         # silently rebuilt, only noted
        assert second.c.messages[0].text == "Remember the number seven."
        send_and_wait(second, qtbot, "Which number?")
    finally:
        close_desk(second)


# -- errors and threads ------------------------------------------------------------------------
def test_a_bad_model_path_shows_an_error_and_the_previous_model_keeps_working(desk, qtbot, tmp_path):
    fresh_conversation(desk, qtbot)
    name = desk.c.model_info.name
    dialog = desk.w.open_settings()
    dialog.editors["model_path"].set_path(str(tmp_path / "missing-model.gguf"))
    with qtbot.wait_signal(desk.c.settingsFailed, timeout=REPLY_MS) as error:
        qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
    assert "missing-model.gguf" in error.args[0] and "not found" in error.args[0]
    qtbot.wait_until(lambda: desk.c.model_state == "ready")
    assert "missing-model.gguf" in dialog.error.text() and dialog.isVisible()      # in the dialog, not behind it
    assert desk.c.settings.model_path is None
    dialog.reject()
    message = send_and_wait(desk, qtbot, "Say OK.")
    assert message.text.strip() and desk.c.model_info.name == name and message.stopped != "error"


def test_a_bad_model_path_at_start_shows_an_error_and_settings_recover(qapp, qtbot, tmp_path):
    settings = test_settings(tmp_path).replace(model_path=str(tmp_path / "gone.gguf"))
    bridge, controller, window = build(settings, (1000, 700))
    window.show()
    try:
        with qtbot.wait_signal(controller.modelStateChanged, timeout=REPLY_MS,
                               check_params_cb=lambda state, detail: state == "failed"):
            controller.start()
        assert "gone.gguf" in window.banner.text() and not window.input.send_button.isEnabled()
        dialog = window.open_settings()
        dialog.editors["model_path"].set_path(None)                     # back to the embedded model
        qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton)
        qtbot.wait_until(lambda: controller.model_state == "ready" and controller.settled,
                         timeout=REPLY_MS)
        assert window.input.send_button.isEnabled()
        desk = SimpleNamespace(bridge=bridge, c=controller, w=window)
        assert send_and_wait(desk, qtbot, "Say OK.").text.strip()
    finally:
        window.close()
        bridge.close()


def test_llama_cpp_never_runs_on_the_gui_thread(desk, qtbot, llama_threads):
    fresh_conversation(desk, qtbot)
    before = sum(llama_threads.values())
    send_and_wait(desk, qtbot, "Count to three.")
    assert sum(llama_threads.values()) > before                        # the recorder saw this turn
    assert threading.main_thread().name not in llama_threads, dict(llama_threads)
    engine_threads = {"evoke-engine", "evoke-compute",
                      *(name for name in llama_threads if name.startswith("evoke-engine-stream-"))}
    assert set(llama_threads) == engine_threads, dict(llama_threads)   # the engine's thread, its replies' streams and
    assert "evoke-engine" in llama_threads                             # the compute thread that runs every decode,
                                                                       # never the app's call threads


def test_the_engine_scheduler_runs_in_the_qt_event_loop(desk):
    from app.qt_scheduler import QtEventLoopScheduler

    scheduler = desk.bridge.scheduler
    assert desk.bridge.scheduler_attached and isinstance(scheduler, QtEventLoopScheduler)
    assert scheduler.running and scheduler.get_jobs()             # the engine's sweeps are on it
    assert scheduler._host.thread() is desk.w.thread() and scheduler._host.active
