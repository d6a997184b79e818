"""Issue 41, items 5 and 7, on the real window and the embedded model (offscreen): a reply that ended short (cut at
max tokens, stopped, interrupted by a crash: a row written as a crash leaves it, and a real SIGKILL of a child
engine mid-reply) says so and continues in the same message with "Continue generating";
a version switch makes that version current (on an edited user message: with the whole branch below it); a reply's
text can be edited. Screenshots: docs/screenshots/interrupted-continue.png and branch-switch.png (refreshed with
EVOKE_SCREENSHOTS=1, else written to the temp folder)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.messages import CONTINUE_LABEL, INTERRUPTED_NOTE, SHORT_ENDS
from evoke_engine.store.history import INTERRUPTED
from integration.test_app_gui import REPLY_MS, close_desk, fresh_conversation, open_desk, send_and_wait

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = (Path(__file__).resolve().parents[2] / "docs" / "screenshots" if os.environ.get("EVOKE_SCREENSHOTS")
         else Path(tempfile.gettempdir()) / "evoke-screenshots")
DAYS = "List the days of the week, one per line."


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    desk = open_desk(tmp_path_factory.mktemp("issue41-replies"))
    yield desk
    close_desk(desk)


def engine_call(desk, fn, *args, **kwargs):
    return desk.bridge.call(fn, *args, **kwargs).result(timeout=60)


def shot(desk, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert desk.w.grab().save(str(SHOTS / name))


def wait_reset(desk, qtbot, bubbles: int) -> None:
    qtbot.wait_until(lambda: len(desk.w.chat.bubbles) == bubbles and not desk.c.stats_pending, timeout=REPLY_MS)


def continue_and_wait(desk, qtbot):
    end = desk.w.chat.bubbles[-1].reply_end
    assert end.button.isVisibleTo(desk.w) and end.button.text() == CONTINUE_LABEL
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS) as done:
        qtbot.mouseClick(end.button, Qt.MouseButton.LeftButton)
    qtbot.wait_until(lambda: not desk.c.generating and not desk.c.stats_pending)
    return done.args[0]


# -- item 5: a reply that ended short ------------------------------------------------------------------
def test_a_reply_cut_at_max_tokens_says_so_and_continues_in_the_same_message(desk, qtbot):
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, DAYS, max_tokens=8)
    bubble = desk.w.chat.bubbles[-1]
    assert bubble.reply_end.isVisibleTo(desk.w) and SHORT_ENDS["max_tokens"] in bubble.reply_end.note.text()
    assert not desk.w.chat.bubbles[0].reply_end.isVisibleTo(desk.w)          # a user message: no mark
    before = engine_call(desk, desk.c.conv.messages)
    message = continue_and_wait(desk, qtbot)
    after = engine_call(desk, desk.c.conv.messages)
    assert len(after) == 2 and after[-1]["id"] == before[-1]["id"]          # the same message grew
    assert message.text.startswith(before[-1]["text"]) and len(message.text) > len(before[-1]["text"])
    assert after[-1]["text"] == message.text and len(desk.w.chat.bubbles) == 2
    assert desk.w.chat.bubbles[-1].source == message.text


def test_a_stopped_reply_says_stopped_and_continue_goes_on_from_its_text(desk, qtbot):
    fresh_conversation(desk, qtbot)
    stop_once = lambda _text: desk.c.stop() if desk.c.generating else None   # noqa: E731
    desk.c.replyProgress.connect(stop_once)
    try:
        send_and_wait(desk, qtbot, DAYS, max_tokens=200)
    finally:
        desk.c.replyProgress.disconnect(stop_once)
    bubble = desk.w.chat.bubbles[-1]
    stopped = engine_call(desk, desk.c.conv.messages)[-1]
    assert stopped["extra"]["metrics"]["stopped"] == "cancelled"
    assert SHORT_ENDS["cancelled"] in bubble.reply_end.note.text()
    message = continue_and_wait(desk, qtbot)
    assert message.text.startswith(stopped["text"]) and len(message.text) > len(stopped["text"])
    assert engine_call(desk, desk.c.conv.messages)[-1]["id"] == stopped["id"]


def test_a_reply_interrupted_by_a_crash_shows_the_mark_and_continues(desk, qtbot):
    engine = desk.c.engine
    conv = engine_call(desk, engine.new_conversation, title="After a crash")
    engine_call(desk, engine.release_conversation, conv.id, False)     # as after a kill -9: no KV open
    engine.history.add_message(conv.id, "user", DAYS)
    row = engine.history.add_message(conv.id, "assistant", "Monday\nTuesday\n", extra={INTERRUPTED: True})
    engine_call(desk, engine.open_conversation, conv.id)                # rebuilt from SQLite, as at a restart
    desk.c.refresh_conversations()
    qtbot.wait_until(lambda: desk.c.conversations.row_of(conv.id) >= 0)
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        desk.c.open_conversation(conv.id)
    qtbot.wait_until(lambda: not desk.c.stats_pending and not desk.w.chat.notice.isVisibleTo(desk.w))
    bubble = desk.w.chat.bubbles[-1]
    assert bubble.reply_end.isVisibleTo(desk.w) and bubble.reply_end.note.text() == INTERRUPTED_NOTE
    assert bubble.reply_end.button.isVisibleTo(desk.w)
    shot(desk, "interrupted-continue.png")
    message = continue_and_wait(desk, qtbot)
    last = engine_call(desk, desk.c.conv.messages)[-1]
    assert last["id"] == row and not last["interrupted"] and last["text"] == message.text
    assert message.text.startswith("Monday\nTuesday\n") and len(message.text) > len("Monday\nTuesday\n")
    assert not desk.w.chat.bubbles[-1].reply_end.note.text().endswith(INTERRUPTED_NOTE)


# a child that streams a long reply until it is killed: one JSON line with the conversation id, then one per piece
CRASH_CHILD = """
import json, sys, threading
from evoke_engine import Engine
from integration.test_app_gui import test_settings
with Engine(test_settings(sys.argv[1]), scheduler=False, prewarm=False) as engine:
    conv = engine.new_conversation(title="Killed mid-reply")
    print(json.dumps({"id": conv.id}), flush=True)
    conv.submit("Write a long story about a dragon.", max_tokens=3000, repeat_penalty=1.0,
                on_token=lambda piece: print(json.dumps({"piece": piece}), flush=True))
    threading.Event().wait()
"""


def kill_mid_reply(home: Path) -> str:
    """Run CRASH_CHILD on `home` and SIGKILL it once its reply's row is in SQLite; the conversation's id."""
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(home)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True,
                             env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"})
    killer = threading.Timer(120, child.kill)                     # a hung child fails the test, never hangs it
    killer.start()
    lines: list[dict] = []
    try:
        for raw in child.stdout:
            lines.append(json.loads(raw))
            if sum("piece" in line for line in lines) >= 40:        # rows are written once a second at most
                os.kill(child.pid, signal.SIGKILL)
                break
    finally:
        killer.cancel()
        child.kill()
        child.wait()
    return lines[0]["id"]


def test_after_a_real_kill_9_the_cut_reply_says_interrupted_and_continues(qapp, qtbot, tmp_path):
    conversation_id = kill_mid_reply(tmp_path)
    crashed = open_desk(tmp_path)
    try:
        qtbot.wait_until(lambda: crashed.c.current_id == conversation_id and len(crashed.w.chat.bubbles) == 2
                         and not crashed.c.stats_pending, timeout=REPLY_MS)
        cut = engine_call(crashed, crashed.c.conv.messages)[-1]
        assert cut["interrupted"] and cut["text"]
        bubble = crashed.w.chat.bubbles[-1]
        assert bubble.reply_end.note.text() == INTERRUPTED_NOTE and bubble.reply_end.button.isVisibleTo(crashed.w)
        message = continue_and_wait(crashed, qtbot)
        last = engine_call(crashed, crashed.c.conv.messages)[-1]
        assert last["id"] == cut["id"] and not last["interrupted"] and last["text"] == message.text
        assert message.text.startswith(cut["text"]) and len(message.text) > len(cut["text"])
        engine_call(crashed, crashed.c.conv.check)
    finally:
        close_desk(crashed)


# -- item 7: versions and branches ---------------------------------------------------------------------
def test_an_earlier_reply_version_becomes_current_and_the_next_turn_builds_on_it(desk, qtbot):
    fresh_conversation(desk, qtbot)
    first = send_and_wait(desk, qtbot, "Name a fruit.", max_tokens=8)
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS):
        assert desk.c.regenerate(temperature=1.0, seed=7, max_tokens=8)
    qtbot.wait_until(lambda: desk.w.chat.bubbles[-1].versions.label.text() == "2/2")
    assert engine_call(desk, desk.c.conv.messages)[-1]["text"] != first.text
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        qtbot.mouseClick(desk.w.chat.bubbles[-1].versions.previous, Qt.MouseButton.LeftButton)
    qtbot.wait_until(lambda: desk.w.chat.bubbles[-1].versions.label.text() == "1/2")
    bubble = desk.w.chat.bubbles[-1]
    assert bubble.text().strip() == first.text.strip() and bubble.versions.next.isEnabled()
    assert all(bubble.buttons[n].isEnabled() for n in ("regenerate", "edit", "fork", "delete"))   # it is current
    send_and_wait(desk, qtbot, "Thanks.", max_tokens=4)
    history = engine_call(desk, desk.c.conv.template_history)
    assert history[1]["content"].strip() == first.text.strip() and len(history) == 4


def test_the_switch_on_an_edited_message_brings_its_whole_branch_back(desk, qtbot):
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Name a color of the sky.", max_tokens=8)
    send_and_wait(desk, qtbot, "Name an animal.", max_tokens=8)
    old = [b.text().strip() for b in desk.w.chat.bubbles]
    with qtbot.wait_signal(desk.c.replyFinished, timeout=REPLY_MS):
        assert desk.c.edit_message(0, "Name a color of grass.", max_tokens=8)
    qtbot.wait_until(lambda: desk.w.chat.bubbles[0].versions.label.text() == "2/2" and not desk.c.stats_pending)
    assert len(desk.w.chat.bubbles) == 2
    edited = [b.text().strip() for b in desk.w.chat.bubbles]
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        qtbot.mouseClick(desk.w.chat.bubbles[0].versions.previous, Qt.MouseButton.LeftButton)
    wait_reset(desk, qtbot, 4)
    qtbot.wait_until(lambda: desk.w.chat.bubbles[0].versions.label.text() == "1/2")
    assert [b.text().strip() for b in desk.w.chat.bubbles] == old            # the old replies, reachable again
    shot(desk, "branch-switch.png")
    assert [m["text"].strip() for m in engine_call(desk, desk.c.conv.messages)] == old
    engine_call(desk, desk.c.conv.check)
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        qtbot.mouseClick(desk.w.chat.bubbles[0].versions.next, Qt.MouseButton.LeftButton)
    wait_reset(desk, qtbot, 2)
    assert [b.text().strip() for b in desk.w.chat.bubbles] == edited


def test_a_reply_can_be_edited_and_its_old_text_stays_a_version(desk, qtbot):
    fresh_conversation(desk, qtbot)
    send_and_wait(desk, qtbot, "Name a color of the sky.", max_tokens=8)
    original = desk.w.chat.bubbles[1].text().strip()
    assert not desk.w.chat.bubbles[1].buttons["edit"].isHidden()              # shown on hover, as on a user message
    desk.w.edit_text = lambda *_args, **_kwargs: "Blue, like the sea."
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        desk.w.chat.bubbles[1].buttons["edit"].click()
    qtbot.wait_until(lambda: desk.w.chat.bubbles[1].versions.label.text() == "2/2")
    assert desk.w.chat.bubbles[1].text().strip() == "Blue, like the sea." and len(desk.w.chat.bubbles) == 2
    history = engine_call(desk, desk.c.conv.template_history)
    assert history[-1]["content"].strip() == "Blue, like the sea."
    with qtbot.wait_signal(desk.c.messagesReset, timeout=REPLY_MS):
        qtbot.mouseClick(desk.w.chat.bubbles[1].versions.previous, Qt.MouseButton.LeftButton)
    qtbot.wait_until(lambda: desk.w.chat.bubbles[1].versions.label.text() == "1/2")
    assert desk.w.chat.bubbles[1].text().strip() == original
