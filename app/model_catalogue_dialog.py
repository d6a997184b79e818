"""The model dialog ("Get a model…"): the catalogue with each quant's fit on this machine, the models on disk, hub
search, and one download with its progress (speed, time left, Cancel), then "Use this model".

Invariant: a view of `ModelDownloads` (app/model_download_flow.py): it shows what the flow's signals carry and calls
its methods; it judges, downloads and loads nothing itself. Every tree item that can be downloaded carries its pull
spec (SPEC_ROLE), every file on disk its path (PATH_ROLE).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from evoke_engine import format_bytes

from .model_download_flow import ModelDownloads

SPEC_ROLE = Qt.ItemDataRole.UserRole            # "REPO:FILE": what Download pulls
PATH_ROLE = Qt.ItemDataRole.UserRole + 1        # a file on disk: what "Use this model" loads
REPO_ROLE = Qt.ItemDataRole.UserRole + 2        # a hub search result whose files are not listed yet
CATALOGUE_COLUMNS = ("Model", "Family", "Size", "Context", "FIM", "Tools", "Licence", "On disk",
                     "Fit on this machine")
ON_DISK, FIT = 7, 8


def duration_text(seconds: float | None) -> str:
    """'14 s', '3 min 05 s', '1 h 02 min'; '' while unknown."""
    if seconds is None:
        return ""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min"


def progress_text(progress: Any) -> str:
    """'12.0 MiB of 93.8 MiB · 5.1 MiB/s · 14 s left'."""
    parts = [f"{format_bytes(progress.done_bytes)} of {format_bytes(progress.total_bytes)}"]
    if progress.speed_bps > 0:
        parts.append(f"{format_bytes(progress.speed_bps)}/s")
    if progress.eta_s is not None:
        parts.append(f"{duration_text(progress.eta_s)} left")
    if progress.resumed_from:
        parts.append(f"resumed at {format_bytes(progress.resumed_from)}")
    return " · ".join(parts)


class ModelDialog(QDialog):
    def __init__(self, downloads: ModelDownloads, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.downloads = downloads
        self.downloaded_path = ""             # the file the last download brought (Use this model loads it)
        self.setWindowTitle("Get a model — Evoke Desk")
        self.setObjectName("modelDialog")
        self.resize(1060, 640)
        col = QVBoxLayout(self)
        self.device = QLabel("Checking this machine…", objectName="modelDevice")
        self.device.setWordWrap(True)
        col.addWidget(self.device)
        self.tabs = QTabWidget(objectName="modelTabs")
        self.catalogue = self._tree(CATALOGUE_COLUMNS, "modelCatalogue")
        self.on_disk = self._tree(("File", "Size", "Catalogue entry", "Fit on this machine"), "modelsOnDisk")
        self.tabs.addTab(self.catalogue, "Catalogue")
        self.tabs.addTab(self.on_disk, "On disk")
        self.tabs.addTab(self._search_page(), "Search the hub")
        col.addWidget(self.tabs, 1)
        self.message = QLabel(objectName="modelMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.hide()
        col.addWidget(self.message)
        row = QHBoxLayout()
        self.progress = QProgressBar(objectName="modelProgress")
        self.progress.setRange(0, 1000)
        self.progress_label = QLabel(objectName="modelProgressText")
        self.cancel_button = QPushButton("Cancel download", objectName="modelCancel")
        self.cancel_button.clicked.connect(downloads.cancel)
        row.addWidget(self.progress, 1)
        row.addWidget(self.progress_label)
        row.addWidget(self.cancel_button)
        col.addLayout(row)
        buttons = QHBoxLayout()
        self.download_button = QPushButton("Download", objectName="modelDownload")
        self.download_button.clicked.connect(self.download_selected)
        self.use_button = QPushButton("Use this model", objectName="modelUse")
        self.use_button.clicked.connect(self.use_selected)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        buttons.addStretch(1)
        for button in (self.download_button, self.use_button, close):
            buttons.addWidget(button)
        col.addLayout(buttons)
        for tree in (self.catalogue, self.on_disk, self.results):
            tree.currentItemChanged.connect(self._update_buttons)
        self.tabs.currentChanged.connect(self._update_buttons)

        self._connected = True
        downloads.listed.connect(self.show_lists)
        downloads.searched.connect(self.show_search)
        downloads.filesListed.connect(self.show_files)
        downloads.started.connect(self._started)
        downloads.progress.connect(self.show_progress)
        downloads.downloaded.connect(self._downloaded)
        downloads.cancelled.connect(self._cancelled)
        downloads.failed.connect(self._failed)
        self._show_download(bool(downloads.downloading))
        if downloads.last is not None:
            self.show_lists(downloads.last)
        downloads.refresh()

    # -- building -----------------------------------------------------------------------------------------------
    @staticmethod
    def _tree(columns: tuple[str, ...], name: str) -> QTreeWidget:
        tree = QTreeWidget(objectName=name)
        tree.setHeaderLabels(list(columns))
        tree.setUniformRowHeights(True)
        tree.setAlternatingRowColors(True)
        tree.header().setStretchLastSection(True)
        return tree

    def _search_page(self) -> QWidget:
        page = QWidget()
        col = QVBoxLayout(page)
        row = QHBoxLayout()
        self.query = QLineEdit(objectName="modelQuery", placeholderText="Search the Hugging Face hub for GGUF "
                               "models (e.g. coder, qwen, llama)")
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search", objectName="modelSearch")
        self.search_button.clicked.connect(self.search)
        row.addWidget(self.query, 1)
        row.addWidget(self.search_button)
        col.addLayout(row)
        self.results = self._tree(("Repository or file", "Size", "Quant", "Downloads", "Updated"), "modelResults")
        self.results.itemExpanded.connect(self._expanded)
        col.addWidget(self.results, 1)
        note = QLabel("Open a repository to list its GGUF files; the fit is judged from the file's header once it "
                      "is downloaded.")
        note.setWordWrap(True)
        col.addWidget(note)
        return page

    # -- lists --------------------------------------------------------------------------------------------------
    def show_lists(self, marks: Any) -> None:
        self.device.setText(f"This machine: {marks.device_label}. Models go to {marks.folder}.")
        self.catalogue.clear()
        by_model: dict[str, QTreeWidgetItem] = {}
        for mark in marks.catalogue:
            model, quant = mark.model, mark.quant
            size = ("~" if quant.size_approximate else "") + format_bytes(quant.size_bytes)
            on_disk = "✓ on disk" if mark.on_disk else ""
            top = by_model.get(model.id)
            if top is None:
                top = QTreeWidgetItem(self.catalogue, [
                    model.name, model.family, "", f"{model.context_length // 1024}K", "FIM" if model.has_fim else "",
                    "tools" if model.has_tools else "", model.licence, "", ""])
                top.setToolTip(0, model.notes or model.repo)
                by_model[model.id] = top
            child = QTreeWidgetItem(top, [quant.name, "", size, "", "", "", "", on_disk, mark.fit_label])
            child.setData(0, SPEC_ROLE, mark.spec)
            child.setToolTip(FIT, mark.fit_label)
            if mark.on_disk:
                child.setData(0, PATH_ROLE, str(mark.on_disk))
                top.setText(ON_DISK, "✓ on disk")
            if quant.name == model.default_quant:             # the entry's row shows its default quant
                top.setText(2, f"{size} ({quant.name})")
                top.setText(FIT, mark.fit_label)
                top.setToolTip(FIT, mark.fit_label)
                top.setData(0, SPEC_ROLE, mark.spec)
                if mark.on_disk:
                    top.setData(0, PATH_ROLE, str(mark.on_disk))
        self.on_disk.clear()
        for local in marks.on_disk:
            try:
                name = str(local.local.path.relative_to(marks.folder))
            except ValueError:
                name = str(local.local.path)
            entry = f"{local.local.catalogue_id} {local.local.quant}" if local.local.catalogue_id else ""
            item = QTreeWidgetItem(self.on_disk, [name, format_bytes(local.local.size_bytes), entry, local.fit_label])
            item.setData(0, PATH_ROLE, str(local.local.path))
            item.setToolTip(0, str(local.local.path))
        self.tabs.setTabText(1, f"On disk ({len(marks.on_disk)})")
        for tree in (self.catalogue, self.on_disk):
            for column in range(tree.columnCount() - 1):
                tree.resizeColumnToContents(column)
        self._update_buttons()

    def search(self) -> None:
        query = self.query.text().strip()
        if not query:
            return
        self.search_button.setEnabled(False)
        self.results.clear()
        self.say(f"Searching the hub for “{query}”…", "info")
        self.downloads.search(query)

    def show_search(self, query: str, found: list[Any]) -> None:
        self.search_button.setEnabled(True)
        self.results.clear()
        for repo in found:
            item = QTreeWidgetItem(self.results, [repo.repo, "", "", str(repo.downloads), repo.updated])
            item.setData(0, REPO_ROLE, repo.repo)
            item.setChildIndicatorPolicy(QTreeWidgetItem.ChildIndicatorPolicy.ShowIndicator)
        self.say(f"{len(found)} GGUF repositories match “{query}”; open one to see its files." if found else
                 f"No GGUF repository on the hub matches “{query}”.", "info")

    def _expanded(self, item: QTreeWidgetItem) -> None:
        repo = item.data(0, REPO_ROLE)
        if repo and item.childCount() == 0:
            self.downloads.list_files(repo)

    def show_files(self, repo: str, listing: Any) -> None:
        top = next((self.results.topLevelItem(i) for i in range(self.results.topLevelItemCount())
                    if self.results.topLevelItem(i).data(0, REPO_ROLE) == repo), None)
        if top is None:
            return
        top.takeChildren()
        for hub_file in listing.files:
            child = QTreeWidgetItem(top, [hub_file.path, format_bytes(hub_file.size_bytes), hub_file.quant or ""])
            child.setData(0, SPEC_ROLE, f"{repo}:{hub_file.path}")
        if not listing.files:
            QTreeWidgetItem(top, ["(no GGUF files: llama.cpp needs GGUF)"])
        top.setExpanded(True)

    # -- download and use ---------------------------------------------------------------------------------------
    def selected(self, role: Qt.ItemDataRole) -> str:
        tree = [self.catalogue, self.on_disk, self.results][self.tabs.currentIndex()]
        item = tree.currentItem()
        return str(item.data(0, role) or "") if item is not None else ""

    def _update_buttons(self, *_: Any) -> None:
        busy = bool(self.downloads.downloading)
        spec = self.selected(SPEC_ROLE)
        path = self.selected(PATH_ROLE)
        self.download_button.setEnabled(bool(spec) and not path and not busy)
        self.use_button.setEnabled(bool(path or self.downloaded_path))

    def download_selected(self) -> None:
        spec = self.selected(SPEC_ROLE)
        if spec:
            self.downloads.download(spec)

    def use_selected(self) -> None:
        path = self.selected(PATH_ROLE) or self.downloaded_path
        if path:
            self.downloads.use(path)
            self.accept()

    def _show_download(self, running: bool) -> None:
        for widget in (self.progress, self.progress_label, self.cancel_button):
            widget.setVisible(running)
        self._update_buttons()

    def _started(self, spec: str) -> None:
        self.downloaded_path = ""
        self.progress.setValue(0)
        self.progress_label.setText(f"Starting {spec.partition(':')[2] or spec}…")
        self.message.hide()
        self._show_download(True)

    def show_progress(self, progress: Any) -> None:
        self.progress.setValue(int(progress.fraction * 1000))
        self.progress_label.setText(progress_text(progress))

    def _downloaded(self, pulled: Any, fit_label: str) -> None:
        self._show_download(False)
        self.downloaded_path = str(pulled.path)
        how = "was already on disk" if pulled.already_present else "is downloaded and its sha256 verified"
        self.say(f"{pulled.file} {how}: {pulled.path}. On this machine it {fit_label}. "
                 "Press “Use this model” to load it.", "ok")
        self.tabs.setCurrentIndex(1)
        self._update_buttons()

    def _cancelled(self, spec: str) -> None:
        self._show_download(False)
        self.say(f"Download cancelled: nothing of {spec.partition(':')[2] or spec} was kept.", "info")

    def _failed(self, job: str, text: str) -> None:
        if job == "search":
            self.search_button.setEnabled(True)
        if job == "download":
            self._show_download(False)
        self.say(text, "error")

    def say(self, text: str, level: str) -> None:
        self.message.setText(text)
        self.message.setProperty("level", level)
        self.message.setStyleSheet({"error": "color: #f85149;", "ok": "color: #3fb950;"}.get(level, ""))
        self.message.show()

    def done(self, result: int) -> None:
        """Closed: the flow (and a running download) outlives the dialog, so its signals are let go."""
        if not self._connected:
            return super().done(result)
        self._connected = False
        for signal, slot in ((self.downloads.listed, self.show_lists), (self.downloads.searched, self.show_search),
                             (self.downloads.filesListed, self.show_files), (self.downloads.started, self._started),
                             (self.downloads.progress, self.show_progress),
                             (self.downloads.downloaded, self._downloaded),
                             (self.downloads.cancelled, self._cancelled), (self.downloads.failed, self._failed)):
            signal.disconnect(slot)
        super().done(result)
