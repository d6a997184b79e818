"""Plain logic behind issue 24's history features: message times, a reply's stored footer, the conversation
reopened at start-up (no Qt, no model)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.last_open import LastConversation, startup_choice
from app.messages import ChatMessage, reply_meta, stamp_text, stored_meta

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)


def at(year: int, month: int, day: int, hour: int, minute: int) -> float:
    return time.mktime((year, month, day, hour, minute, 0, 0, 0, -1))


def test_a_message_time_is_the_clock_today_and_carries_the_date_otherwise() -> None:
    now = at(2025, 6, 10, 18, 0)
    assert stamp_text(at(2025, 6, 10, 9, 5), now) == "09:05"
    assert stamp_text(at(2025, 6, 9, 23, 59), now) == "9 Jun 23:59"
    assert stamp_text(at(2024, 12, 31, 7, 30), now) == "31 Dec 2024 07:30"
    assert stamp_text(0.0, now) == ""


def test_a_reply_read_back_shows_the_footer_its_row_kept() -> None:
    metrics = {"tokens": 12, "tokens_per_s": 30.04, "ttft_s": 0.251, "stopped": "max_tokens"}
    row = {"role": "assistant", "text": "Hi.", "attachments": [], "created_at": 5.0, "id": 7,
           "extra": {"metrics": metrics}}
    message = ChatMessage.from_history(row, 1)
    assert message.meta == reply_meta(12, 30.04, 0.251, "max_tokens") == \
        "12 tokens · 30.0 tok/s · first token 0.25 s · max tokens"
    assert (message.stopped, message.created_at, message.row_id, message.index) == ("max_tokens", 5.0, 7, 1)
    assert stored_meta({"role": "assistant", "extra": {}}) == ""                      # a row from before: no footer
    assert stored_meta({"role": "assistant", "extra": {"metrics": {"tokens": "x"}}}) == ""   # damaged: none either
    assert stored_meta({"role": "user", "extra": {"metrics": metrics}}) == ""


def test_start_up_opens_the_last_shown_conversation_when_it_still_exists(tmp_path: Path) -> None:
    last = LastConversation(tmp_path / "config")
    assert last.recall() == ""                                         # nothing remembered yet
    last.remember("c-old")
    assert LastConversation(tmp_path / "config").recall() == "c-old"   # kept across restarts
    ids = ["c-pinned", "c-new", "c-old"]
    assert startup_choice(ids, "", "c-old") == "c-old"
    assert startup_choice(ids, "c-new", "c-old") == "c-new"            # the one read while the model loaded
    assert startup_choice(ids, "", "c-deleted") == "c-pinned"          # gone: the first listed
    assert startup_choice([], "", "c-old") is None


def test_remembering_never_raises_on_a_bad_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    last = LastConversation(blocker)
    last.remember("c1")
    assert last.recall() == ""
