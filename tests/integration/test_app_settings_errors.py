"""Issue 41, item 4, in the real window (offscreen) on the embedded model: the saved settings' problems are shown at
start (the field, the file, why, where to change it), the other saved values are kept, a saved budget below the
smallest that works (an older install's 512) is flagged before any Ctrl+N, and the budget's hint states the real
minimum."""

from __future__ import annotations

import json

import pytest

from app.__main__ import build
from app.settings_form import human_bytes
from evoke_engine import Settings
from integration.test_app_gui import REPLY_MS
from integration.test_app_issue24 import seed_history

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

SAVED = {"embedder": "off", "tools_enabled": True, "temperature": 0.0, "n_ctx": 4096, "slots": 3, "n_threads": 1,
         "top_p": 0.5, "budget_tokens": 512,                       # an older install's floor: below today's smallest
         "max_tokens": 4096.7, "top_k": True}                      # wrong types for integers


def test_the_window_names_each_bad_saved_setting_and_flags_a_budget_below_the_smallest(qapp, qtbot, tmp_path):
    path = tmp_path / "config" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(SAVED))
    settings = Settings.load(home=str(tmp_path))                  # as `python -m app` loads them
    assert (settings.top_p, settings.n_threads, settings.budget_tokens) == (0.5, 1, 512)
    assert (settings.max_tokens, settings.top_k) == (Settings.max_tokens, Settings.top_k)
    seed_history(settings)
    bridge, controller, window = build(settings, (1100, 760))
    window.show()
    try:
        controller.start()
        text = window.banner.text()                                # at once, before the model is ready
        assert str(path) in text
        assert "max_tokens = 4096.7" in text and "not a whole number" in text
        assert "Settings → Sampling → Max reply tokens" in text
        assert "top_k = true" in text and "Settings → Sampling → Top-k" in text
        qtbot.wait_until(lambda: "below the smallest" in window.banner.text(), timeout=REPLY_MS)
        smallest = bridge.call(controller.engine.min_budget_tokens).result(timeout=30)
        assert smallest > 512
        text = window.banner.text()
        assert "saved budget (512 tokens)" in text and f"({smallest} tokens)" in text
        assert "Settings → Memory → Budget" in text and "max_tokens" in text      # both notes stay
        qtbot.wait_until(lambda: controller.conv is not None and controller.stats is not None, timeout=REPLY_MS)
        assert "below the smallest" in window.banner.text()                      # opening a conversation keeps it

        bridge.call(controller.engine.release_conversation, controller.current_id).result(timeout=60)
        used = controller.engine.kvfiles.total_bytes()
        assert used > 0
        dialog = window.open_settings()                            # the KV disk use beside its cap (item 11)
        qtbot.wait_until(lambda: "in use now" in dialog.hints["disk_budget_bytes"].text(), timeout=30_000)
        assert f"in use now: {human_bytes(used)} of 4 GiB" in dialog.hints["disk_budget_bytes"].text()
        hint = dialog.hints["budget_tokens"].text()                # the budget's hint: the real minimum
        assert f"{smallest} to 262144 tokens" in hint and "64 to" not in hint
        dialog.set_value("block_tokens", 64)                       # it follows the block size being edited
        assert f"{smallest} to" not in dialog.hints["budget_tokens"].text()
        dialog.set_value("block_tokens", settings.block_tokens)
        dialog.set_value("budget_tokens", smallest)
        with qtbot.wait_signal(controller.settingsApplied, timeout=REPLY_MS):
            dialog.accept()
        qtbot.wait_until(lambda: not window.banner.isVisible(), timeout=REPLY_MS)   # fixed and saved: it clears
        assert json.loads(path.read_text())["budget_tokens"] == smallest
        assert Settings.load_checked(home=str(tmp_path))[1] == []
    finally:
        window.close()
        bridge.close()
