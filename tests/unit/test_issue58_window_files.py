"""Issue 58 item 17, the smaller ones, on plain objects and widgets (no model): the log file and the
`last_conversation` file are 0600 in 0700 folders under umask 022 and 000; `--help` of the window entry names the
data folder, the settings and the log file and lists every engine subcommand; a kept file's blocks are marked in the
block table itself (the State pill says "kept", the name is bold), not only in a tooltip; the import and export
dialogs open in the folder last used, across restarts."""

from __future__ import annotations

import logging
import os
import stat

import pytest
from PySide6.QtWidgets import QFileDialog

from app import dialogs
from app.last_open import FILE_NAME, LastConversation
from evoke_engine.logs import configure_logging

pytestmark = [pytest.mark.unit, pytest.mark.gui]


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request):
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_the_last_conversation_file_is_private(tmp_path, umask) -> None:
    config = tmp_path / "home" / "config"
    LastConversation(config).remember("c-1")
    assert mode_of(config / FILE_NAME) == 0o600 and mode_of(config) == 0o700
    LastConversation(config).remember("c-2")                  # replaced: still private, and read back
    assert mode_of(config / FILE_NAME) == 0o600 and LastConversation(config).recall() == "c-2"
    assert sorted(p.name for p in config.iterdir()) == [FILE_NAME]      # no temporary file left


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_the_log_file_is_private(tmp_path, umask, restore_logging) -> None:
    path = configure_logging(home=str(tmp_path / "home"))
    logging.getLogger("issue58").warning("a line")
    assert path is not None and mode_of(path) == 0o600 and mode_of(path.parent) == 0o700


def test_help_names_the_data_folder_the_log_file_and_every_engine_command(tmp_path, monkeypatch, capsys) -> None:
    from app.__main__ import parse_args
    from evoke_engine.__main__ import build_parser, subcommands

    monkeypatch.setenv("EVOKE_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as done:
        parse_args(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "data") in out and str(tmp_path / "log" / "evoke-desk.log") in out
    assert str(tmp_path / "config" / "settings.json") in out
    for command in subcommands(build_parser()):
        assert command in out
    assert "aider-metadata" in out
    assert "evoke-desk bench" not in out                  # a checkout's entry point has no lab command


def test_the_bundles_help_names_its_lab_command(tmp_path, monkeypatch, capsys) -> None:
    import sys

    from app.__main__ import parse_args

    monkeypatch.setenv("EVOKE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "frozen", True, raising=False)       # as PyInstaller's bundle runs it
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "evoke-desk bench NAME" in capsys.readouterr().out


def test_a_kept_file_is_marked_in_the_table_not_only_in_its_tooltip(qtbot) -> None:
    from PySide6.QtCore import Qt

    from app.item_models import BlockTableModel, EventLogModel
    from app.widgets.memory_panel import MemoryPanel, StateDelegate

    model = BlockTableModel()
    panel = MemoryPanel(model, EventLogModel())
    qtbot.addWidget(panel)
    model.set_blocks([{"name": "notes.txt#1", "tokens": 120, "state": "resident", "pinned": True,
                       "file_name": "notes.txt"},
                      {"name": "u1", "tokens": 30, "state": "resident"}])
    panel.show()
    delegate = panel.table.itemDelegateForColumn(2)
    assert isinstance(delegate, StateDelegate)
    kept, plain = model.index(0, 2), model.index(1, 2)
    assert delegate.pill_text(kept).endswith("kept") and "kept" not in delegate.pill_text(plain)
    metrics = panel.table.fontMetrics()
    assert panel.table.columnWidth(2) >= metrics.horizontalAdvance(delegate.pill_text(kept))   # the mark fits
    assert model.index(0, 0).data(Qt.ItemDataRole.FontRole).bold()
    assert model.index(1, 0).data(Qt.ItemDataRole.FontRole) is None


def test_import_and_export_dialogs_open_in_the_folder_last_used(qtbot, tmp_path, monkeypatch) -> None:
    opened: list[str] = []
    chosen = tmp_path / "exports"
    chosen.mkdir()

    def save_name(parent, caption, start, filters):
        opened.append(start)
        return str(chosen / "chat.md"), filters

    def open_names(parent, caption, start, filters):
        opened.append(start)
        return [str(tmp_path / "imports" / "a.md")], filters

    def existing(parent, caption, start):
        opened.append(start)
        return str(tmp_path / "imports")

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_name)
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", open_names)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", existing)
    (tmp_path / "imports").mkdir()
    store = tmp_path / "config" / "window.ini"
    folders = dialogs.FolderMemory(store)
    assert dialogs.save_export(None, "chat.md", folders=folders) == str(chosen / "chat.md")
    assert opened[-1] == os.path.join(os.path.expanduser("~"), "chat.md")      # nothing used yet: home
    assert dialogs.pick_import(None, folders=folders) == [str(tmp_path / "imports" / "a.md")]
    assert opened[-1] == str(chosen)                                          # where the export went
    restarted = dialogs.FolderMemory(store)                                    # kept across restarts
    dialogs.pick_folder(None, folders=restarted)
    assert opened[-1] == str(tmp_path / "imports")
    dialogs.save_export(None, "next.md", folders=restarted)
    assert opened[-1] == str(tmp_path / "imports" / "next.md")

