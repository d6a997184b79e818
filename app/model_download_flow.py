"""Getting a model from the window: the catalogue and the models folder with their fit marks, hub search, a
repository's files, one download at a time, and "Use this model". The work is the engine's (evoke_engine.models);
this only runs it off the GUI thread and brings the outcomes back as signals (app/model_catalogue_dialog.py shows
them). Also the hooks: the Model menu's "Get a model…" and the link on the empty chat while the tiny embedded model
is in use.

Invariants: nothing here runs on the GUI thread but the signal deliveries (each job is a daemon thread, so a hub that
never answers cannot hold the window's exit); one download at a time; Cancel deletes its partial, closing the window
keeps it (the next download of that file resumes); the model is switched only through the controller's
`apply_settings`, as the settings dialog's model picker does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction

from .bridge import error_text

if TYPE_CHECKING:
    from .window import MainWindow

log = logging.getLogger(__name__)


class WindowClosing(Exception):  # noqa: N818 - a stop, raised through the download's progress callback
    """Raised in the download thread when the window closes: download_file keeps the partial for a resume."""


class ModelDownloads(QObject):
    """The model dialog's work, off the GUI thread. `failed(job, message)`: job is "list", "search", "files" or
    "download"; the message is the engine's own (offline, sha256 mismatch, disk full ... each says what to do)."""

    listed = Signal(object)               # evoke_engine.models.fit_marks.MachineMarks
    searched = Signal(str, object)        # query, [HubRepo]
    filesListed = Signal(str, object)     # repo, RepoListing
    started = Signal(str)                 # the spec being downloaded (REPO:FILE)
    progress = Signal(object)             # DownloadProgress (at most ten a second)
    downloaded = Signal(object, str)      # PulledModel, its fit here
    cancelled = Signal(str)               # the spec whose download was cancelled (nothing kept)
    failed = Signal(str, str)             # job, message
    _deliver = Signal(object, object)     # callback, argument (runs on the GUI thread)

    def __init__(self, controller: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.downloading = ""             # the spec of the running download ("" when none)
        self.last: Any = None             # the last MachineMarks listed
        self._cancel = threading.Event()
        self._closing = False
        self._deliver.connect(self._on_deliver, Qt.ConnectionType.QueuedConnection)

    # -- jobs ---------------------------------------------------------------------------------------------------
    def _run(self, job: str, work: Callable[[], Any], on_done: Callable[[Any], None],
             on_error: Callable[[BaseException], None] | None = None) -> threading.Thread:
        def body() -> None:
            try:
                result = work()
            except BaseException as exc:  # noqa: BLE001 - every failure reaches the dialog
                log.debug("model job %s failed", job, exc_info=exc)
                self._emit(on_error or (lambda e: self.failed.emit(job, error_text(e))), exc)
                return
            self._emit(on_done, result)
        thread = threading.Thread(target=body, name=f"evoke-models-{job}", daemon=True)
        thread.start()
        return thread

    def _emit(self, callback: Callable[[Any], None], argument: Any) -> None:
        if not self._closing:
            self._deliver.emit(callback, argument)

    def _on_deliver(self, callback: Callable[[Any], None], argument: Any) -> None:
        if not self._closing:
            callback(argument)

    def refresh(self) -> None:
        """List the catalogue and the models folder with their fit here (`listed`)."""
        from evoke_engine import load_catalogue, machine_marks

        settings = self.controller.settings

        def done(marks: Any) -> None:
            self.last = marks
            self.listed.emit(marks)
        self._run("list", lambda: machine_marks(settings, load_catalogue()), done)

    def search(self, query: str) -> None:
        """GGUF repositories on the hub matching `query` (`searched`)."""
        from evoke_engine import search_gguf

        self._run("search", lambda: search_gguf(query), lambda found: self.searched.emit(query, found))

    def list_files(self, repo: str) -> None:
        """A hub repository's GGUF files with sizes and sha256 (`filesListed`)."""
        from evoke_engine import list_gguf_files

        self._run("files", lambda: list_gguf_files(repo), lambda listing: self.filesListed.emit(repo, listing))

    def download(self, spec: str) -> bool:
        """Download `REPO:FILE` (or any `pull` spec) into the models folder; False while another runs."""
        if self.downloading:
            return False
        from evoke_engine import DownloadCancelled, judge_file, load_catalogue, models_dir, pull

        settings = self.controller.settings
        folder = models_dir(settings.data_dir)
        self.downloading, self._cancel = spec, threading.Event()
        cancel = self._cancel

        def report(progress: Any) -> None:
            if self._closing:
                raise WindowClosing("the window closed")
            self._emit(self.progress.emit, progress)

        def work() -> tuple[Any, str]:
            pulled = pull(spec, folder, catalogue=load_catalogue(), on_progress=report, cancel=cancel)
            return pulled, judge_file(pulled.path, settings)

        def done(result: tuple[Any, str]) -> None:
            self.downloading = ""
            self.downloaded.emit(*result)
            self.refresh()

        def failed(exc: BaseException) -> None:
            self.downloading = ""
            if isinstance(exc, DownloadCancelled):
                self.cancelled.emit(spec)
            else:
                self.failed.emit("download", error_text(exc))
            self.refresh()
        self.started.emit(spec)
        self._run("download", work, done, failed)
        return True

    def cancel(self) -> None:
        """Stop the running download; its partial file is deleted (`cancelled` follows)."""
        self._cancel.set()

    def use(self, path: str) -> None:
        """Load the model at `path`: the model path setting changes and the model reloads, through the same
        `apply_settings` as the settings dialog's model picker (settingsApplied or settingsFailed follows)."""
        self.controller.apply_settings(self.controller.settings.replace(model_path=str(path)))

    def close(self) -> None:
        """The window is closing: no more signals; a running download stops at its next progress report and keeps
        its partial file for a resume."""
        self._closing = True


def install_models(window: MainWindow) -> None:
    """The Model menu (before Help) with "Get a model…", and the link on the empty chat while the embedded model is
    the one in use (the first start). `window.model_dialog` is the dialog last opened (None before)."""
    c = window.controller
    window.model_downloads = ModelDownloads(c, window)
    window.model_dialog = None
    window.closed.connect(window.model_downloads.close)
    window.get_model_action = QAction("Get a model…", window, triggered=lambda: open_model_dialog(window))
    help_action = next((a for a in window.menuBar().actions() if a.text() == "&Help"), None)
    menu = window.menuBar().addMenu("&Model")
    if help_action is not None:                          # Help stays last
        window.menuBar().insertMenu(help_action, menu)
    menu.addAction(window.get_model_action)
    placeholder = window.chat.placeholder
    plain = placeholder.text()

    def offer(settings: Any) -> None:
        if getattr(settings, "model_path", None):
            placeholder.setText(plain)
            return
        placeholder.setText(f"{plain}<br><br>The built-in model is a tiny one for trying the app out. "
                            "<a href='models'>Get a coding model…</a> (two clicks, and it says first whether it "
                            "fits this machine)")
    placeholder.setTextFormat(Qt.TextFormat.RichText)
    placeholder.setOpenExternalLinks(False)
    placeholder.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse
                                        | Qt.TextInteractionFlag.LinksAccessibleByKeyboard)
    placeholder.linkActivated.connect(lambda _link: open_model_dialog(window))
    offer(c.settings)
    c.settingsApplied.connect(offer)


def open_model_dialog(window: MainWindow) -> Any:
    from .model_catalogue_dialog import ModelDialog

    dialog = ModelDialog(window.model_downloads, window)
    window.model_dialog = dialog
    window.show_dialog(dialog)
    return dialog
