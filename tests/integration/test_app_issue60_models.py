"""Issue 60 in the window (offscreen, the embedded model): the Model menu's "Get a model…" dialog lists the catalogue
with each quant's fit on this machine, searches the hub (tests/helpers/fake_hub.py, serving the embedded model under
another repository name), downloads a file with progress and Cancel, and "Use this model" loads it through the
settings' model path, then a reply comes from it. Offline the dialog says which hub it could not reach and still
lists the catalogue; a cancelled download leaves nothing a model list could show, nor does a damaged one (its
message says so)."""

from __future__ import annotations

import pytest
from helpers.fake_hub import FakeHub
from PySide6.QtCore import Qt

from app.model_catalogue_dialog import PATH_ROLE, SPEC_ROLE, duration_text, progress_text
from evoke_engine.models import DownloadProgress, load_catalogue, local_models
from evoke_engine.runtime.model_file import default_model_path
from integration.test_app_gui import REPLY_MS, close_desk, fresh_conversation, open_desk, send_and_wait

pytestmark = [pytest.mark.gui, pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]

REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture(scope="module")
def desk(qapp, tmp_path_factory):
    desk = open_desk(tmp_path_factory.mktemp("issue60-home"))
    yield desk
    close_desk(desk)


@pytest.fixture
def hub(monkeypatch):
    """The fake hub with the embedded model as REPO/FILE; huggingface_hub pointed at it and online."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)   # read once at its import
    with FakeHub() as server:
        server.add_file(REPO, FILE, default_model_path())
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def open_dialog(desk, qtbot):
    """Model → Get a model…, then the lists arrive (the fit is judged off the GUI thread)."""
    with qtbot.wait_signal(desk.w.model_downloads.listed, timeout=REPLY_MS):
        desk.w.get_model_action.trigger()
    dialog = desk.w.model_dialog
    assert dialog is not None and dialog.isVisible()
    return dialog


def models_folder(desk):
    return desk.c.settings.data_dir / "models"


def visible_models(desk) -> list:
    folder = models_folder(desk)
    return sorted(p for p in folder.rglob("*") if p.is_file() and ".partial" not in p.parts) if folder.exists() else []


def search_and_pick(dialog, qtbot, query: str = "smollm2"):
    """Search the hub, open the repository, select its file: the Download button is ready."""
    dialog.tabs.setCurrentIndex(2)
    dialog.query.setText(query)
    with qtbot.wait_signal(dialog.downloads.searched, timeout=REPLY_MS):
        qtbot.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
    assert dialog.results.topLevelItemCount() == 1
    repo = dialog.results.topLevelItem(0)
    assert repo.text(0) == REPO
    with qtbot.wait_signal(dialog.downloads.filesListed, timeout=REPLY_MS):
        repo.setExpanded(True)
    assert [repo.child(i).text(0) for i in range(repo.childCount())] == [FILE]
    dialog.results.setCurrentItem(repo.child(0))
    assert repo.child(0).data(0, SPEC_ROLE) == f"{REPO}:{FILE}"
    assert dialog.download_button.isEnabled()


def test_the_model_menu_and_the_first_start_link_open_the_catalogue_with_fit_marks(desk, qtbot):
    menus = [a.text() for a in desk.w.menuBar().actions()]
    assert "&Model" in menus and menus[-1] == "&Help"
    assert "Get a coding model" in desk.w.chat.placeholder.text()       # the embedded model is in use
    dialog = open_dialog(desk, qtbot)
    catalogue = load_catalogue()
    assert dialog.catalogue.topLevelItemCount() == len(catalogue.models)
    first, entry = dialog.catalogue.topLevelItem(0), catalogue.models[0]
    assert (first.text(0), first.text(1), first.text(6)) == (entry.name, entry.family, entry.licence)
    assert first.text(2).endswith(f"({entry.default_quant})") and first.text(3) == f"{entry.context_length // 1024}K"
    assert first.childCount() == len(entry.quants)
    labels = [first.child(i).text(8) for i in range(first.childCount())]
    assert all(any(word in label for word in ("fits on the GPU", "partly offloaded", "runs on the CPU", "too big"))
               for label in labels), labels
    assert "This machine:" in dialog.device.text()
    dialog.reject()
    desk.w.chat.placeholder.linkActivated.emit("models")                # the link on the empty chat
    assert desk.w.model_dialog is not dialog and desk.w.model_dialog.isVisible()
    desk.w.model_dialog.reject()


def test_offline_says_so_and_the_catalogue_is_still_listed(desk, qtbot, hub):
    url = hub.url
    hub.stop()
    dialog = open_dialog(desk, qtbot)
    assert dialog.catalogue.topLevelItemCount() == len(load_catalogue().models)
    dialog.tabs.setCurrentIndex(2)
    dialog.query.setText("coder")
    with qtbot.wait_signal(dialog.downloads.failed, timeout=REPLY_MS) as failed:
        qtbot.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
    assert failed.args[0] == "search"
    assert f"cannot reach the model hub at {url}" in dialog.message.text()
    assert "Models already on disk still work" in dialog.message.text() and dialog.message.isVisible()
    assert dialog.search_button.isEnabled()
    dialog.tabs.setCurrentIndex(0)                                     # a catalogue download, offline
    top = dialog.catalogue.topLevelItem(0)
    dialog.catalogue.setCurrentItem(top.child(0))
    with qtbot.wait_signal(dialog.downloads.failed, timeout=REPLY_MS):
        qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    assert f"cannot reach the model hub at {url}" in dialog.message.text()
    assert not dialog.cancel_button.isVisible() and visible_models(desk) == []
    dialog.reject()


def test_a_cancelled_download_leaves_nothing_listed(desk, qtbot, hub):
    hub.chunk_delay_s = 0.05                             # ~5 MB/s: seconds to press Cancel in
    dialog = open_dialog(desk, qtbot)
    search_and_pick(dialog, qtbot)
    with qtbot.wait_signal(dialog.downloads.progress, timeout=REPLY_MS):
        qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    assert dialog.cancel_button.isVisible() and dialog.progress.isVisible()
    assert not dialog.download_button.isEnabled()                      # one download at a time
    with qtbot.wait_signals([dialog.downloads.cancelled, dialog.downloads.listed], timeout=REPLY_MS):
        qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    assert "Download cancelled: nothing of" in dialog.message.text()
    assert not dialog.cancel_button.isVisible()
    assert visible_models(desk) == [] and local_models(models_folder(desk)) == []
    assert not (models_folder(desk) / ".partial").exists()
    assert dialog.on_disk.topLevelItemCount() == 0
    dialog.reject()


def test_a_damaged_download_is_refused_with_the_reason_and_nothing_kept(desk, qtbot, hub):
    hub.corrupt = True
    dialog = open_dialog(desk, qtbot)
    search_and_pick(dialog, qtbot)
    with qtbot.wait_signal(dialog.downloads.failed, timeout=REPLY_MS) as failed:
        qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    assert failed.args[0] == "download"
    assert f"{FILE} arrived damaged" in dialog.message.text() and "Nothing was kept" in dialog.message.text()
    assert not dialog.use_button.isEnabled() and dialog.download_button.isEnabled()
    assert visible_models(desk) == [] and not (models_folder(desk) / ".partial").exists()
    dialog.reject()


def test_a_download_from_the_hub_is_chosen_and_replies(desk, qtbot, hub):
    dialog = open_dialog(desk, qtbot)
    search_and_pick(dialog, qtbot)
    shown = []
    dialog.downloads.progress.connect(lambda _p: shown.append(dialog.progress_label.text()))
    with qtbot.wait_signal(dialog.downloads.downloaded, timeout=REPLY_MS) as done:
        qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    pulled = done.args[0]
    assert pulled.path == models_folder(desk) / REPO / FILE and pulled.sha256
    assert shown and " of " in shown[-1] and any("/s" in text for text in shown)
    assert "sha256 verified" in dialog.message.text() and str(pulled.path) in dialog.message.text()
    qtbot.wait_until(lambda: dialog.on_disk.topLevelItemCount() == 1)
    item = dialog.on_disk.topLevelItem(0)
    assert item.data(0, PATH_ROLE) == str(pulled.path) and item.text(0) == f"{REPO}/{FILE}"
    assert dialog.tabs.currentIndex() == 1 and dialog.use_button.isEnabled()

    with qtbot.wait_signals([desk.c.settingsApplied, desk.c.modelInfoChanged], timeout=REPLY_MS):
        qtbot.mouseClick(dialog.use_button, Qt.MouseButton.LeftButton)     # the settings' reload path
    assert not dialog.isVisible()
    qtbot.wait_until(lambda: desk.c.model_state == "ready" and desk.c.settled, timeout=REPLY_MS)
    assert desk.c.settings.model_path == str(pulled.path)
    assert desk.c.model_info.path == str(pulled.path)
    assert "Get a coding model" not in desk.w.chat.placeholder.text()   # a real model is chosen now
    fresh_conversation(desk, qtbot)
    message = send_and_wait(desk, qtbot, "Say hello.")
    assert message.text.strip() and message.stopped != "error"


def test_progress_reads_as_size_speed_and_time_left():
    progress = DownloadProgress(FILE, 12 << 20, 94 << 20, 5.5 * (1 << 20), 14.6, resumed_from=0)
    assert progress_text(progress) == "12.0 MiB of 94.0 MiB · 5.5 MiB/s · 15 s left"
    assert progress_text(DownloadProgress(FILE, 0, 10, 0.0, None, 4)) == "0 B of 10 B · resumed at 4 B"
    assert [duration_text(s) for s in (None, 3, 185, 3720)] == ["", "3 s", "3 min 05 s", "1 h 02 min"]
