"""The main window: sidebar, conversation, input, memory dock and status bar, wired to the controller.

Invariant: the window only connects controller signals to widgets and user actions to
controller methods; modal questions go through `confirm` / `ask_text` / `edit_text` /
`pick_files` / `save_export` / `pick_import` (app/dialogs.py, replaced in tests). Keyboard focus
starts in the message box and goes back there after every conversation change. In a small window the side
panels give way to the chat (app/window_room.py): no minimum size here is wider than a small screen.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from PySide6.QtCore import QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import dialogs
from .controller import ChatController
from .endpoint_switch import EndpointSwitch
from .resources import icon
from .widgets.chat_view import ChatView
from .widgets.conversation_list import ConversationSidebar
from .widgets.elided_label import ElidedLabel
from .widgets.input_bar import InputBar
from .widgets.memory_panel import MemoryPanel
from .widgets.settings_dialog import SettingsDialog
from .widgets.status_bar import StatusBar
from .window_extras import install_extras
from .window_room import CHAT_MIN_WIDTH, MEMORY_MIN_WIDTH, SIDEBAR_MIN_WIDTH, PanelRoom


class ErrorBanner(QWidget):
    """A dismissible line above the conversation for readable errors (the app stays usable).

    Each message has a topic (app/controller.py ERROR_TOPICS); `resolve(topic)` hides it when its cause is gone.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("errorBanner")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        row = QHBoxLayout(self)
        row.setContentsMargins(14, 8, 8, 8)
        self.label = QLabel(objectName="errorText")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton(text="×", objectName="bannerClose")
        close.clicked.connect(self.hide)
        row.addWidget(self.label, 1)
        row.addWidget(close)
        self.hide()

    topic = ""

    def show_message(self, text: str, level: str = "error", topic: str = "") -> None:
        self.topic = topic
        self.label.setText(text)
        self.setProperty("level", level)
        for widget in (self, self.label):
            widget.style().unpolish(widget)
            widget.style().polish(widget)
        self.show()

    def show_warning(self, text: str, topic: str = "warning") -> None:
        self.show_message(text, "warning", topic)

    def resolve(self, topic: str) -> None:
        if self.isVisible() and self.topic == topic:
            self.hide()

    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""


class MainWindow(QMainWindow):
    closed = Signal()

    def __init__(self, controller: ChatController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self._shown_id = ""                       # the conversation whose draft the message box holds
        self._drafts: dict[str, str] = {}         # the drafts of the conversations not shown
        self.confirm = dialogs.confirm
        self.ask_text = dialogs.ask_text
        self.pick_files = dialogs.pick_files
        self.edit_text = dialogs.edit_text
        self.exchange_folders = dialogs.FolderMemory(controller.settings.config_dir / "window.ini")
        self.save_export = partial(dialogs.save_export, folders=self.exchange_folders)
        self.pick_import = partial(dialogs.pick_import, folders=self.exchange_folders)
        self.settings_dialog: SettingsDialog | None = None
        self.setWindowTitle("Evoke Desk")
        self.setWindowIcon(icon("evoke-desk"))
        self.setAcceptDrops(True)
        self.resize(1440, 900)
        self._build()
        self._wire()
        install_extras(self)                 # undo bar, versions, Help menu, theme (app/window_extras.py)
        self._restore_layout()
        self.input.prompt.setFocus(Qt.FocusReason.OtherFocusReason)   # what is typed first lands in the box

    # -- layout -----------------------------------------------------------------------------
    def _build(self) -> None:
        c = self.controller
        self.sidebar = ConversationSidebar(c.conversations)
        self.sidebar.setMinimumWidth(SIDEBAR_MIN_WIDTH)
        self.title = ElidedLabel("Evoke Desk", objectName="conversationTitle")     # a long title is cut, with "…"
        self.banner = ErrorBanner()
        self.chat = ChatView()
        self.input = InputBar()
        self.centre = centre = QWidget(objectName="centre")
        centre.setMinimumWidth(CHAT_MIN_WIDTH)
        col = QVBoxLayout(centre)
        col.setContentsMargins(0, 0, 0, 0)
        col.setSpacing(0)
        header = QWidget(objectName="header")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(24, 10, 12, 10)
        hl.addWidget(self.title, 1)
        col.addWidget(header)
        col.addWidget(self.banner)
        col.addWidget(self.chat, 1)
        col.addWidget(self.input)
        split = QSplitter(Qt.Orientation.Horizontal, objectName="mainSplit")
        split.addWidget(self.sidebar)
        split.addWidget(centre)
        split.setStretchFactor(1, 1)
        split.setCollapsible(1, False)           # the sidebar may be dragged shut, the conversation never
        split.setSizes([270, 800])
        self.setCentralWidget(split)
        self.memory = MemoryPanel(c.blocks, c.events)
        self.memory.keepFileAsked.connect(c.keep_file)
        self.memory_dock = QDockWidget("Memory", self, objectName="memoryDock")
        self.memory_dock.setWidget(self.memory)
        self.memory_dock.setMinimumWidth(MEMORY_MIN_WIDTH)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.memory_dock)
        self.resizeDocks([self.memory_dock], [400], Qt.Orientation.Horizontal)
        self.room = PanelRoom(self)              # the panels give way to the chat in a small window
        self.status = StatusBar()
        self.setStatusBar(self.status)
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("mainToolbar")
        toolbar.setMovable(False)
        toolbar.setIconSize(QSize(18, 18))
        toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.new_action = QAction(icon("new"), "New", self, shortcut=QKeySequence.StandardKey.New,
                                  triggered=c.new_conversation)
        self.settings_action = QAction(icon("settings"), "Settings", self, shortcut=QKeySequence("Ctrl+,"),
                                       triggered=self.open_settings)
        self.memory_action = self.memory_dock.toggleViewAction()
        self.memory_action.setIcon(icon("memory"))
        self.memory_action.setText("Memory")
        self.memory_action.setShortcut(QKeySequence("Ctrl+M"))
        for action in (self.new_action, self.settings_action, self.memory_action):
            toolbar.addAction(action)
        self.stop_action = QAction("Stop generating", self, shortcut=QKeySequence(Qt.Key.Key_Escape),
                                   triggered=c.stop)
        self.addAction(self.stop_action)
        self.regenerate_action = QAction("Regenerate reply", self, shortcut=QKeySequence("Ctrl+Shift+R"),
                                         triggered=lambda: c.regenerate())
        self.addAction(self.regenerate_action)
        self.find_action = QAction("Search messages", self, shortcut=QKeySequence.StandardKey.Find,
                                   triggered=self.focus_search)
        self.addAction(self.find_action)
        menu = self.menuBar().addMenu("&File")
        menu.addAction(self.new_action)
        menu.addAction("Attach files…", self.attach_files)
        menu.addSeparator()
        self.export_action = menu.addAction("Export…", self.export_conversation)
        self.import_action = menu.addAction("Import…", self.import_conversation)
        menu.addSeparator()
        menu.addAction(self.settings_action)
        menu.addSeparator()
        menu.addAction("Quit", QKeySequence.StandardKey.Quit, self.close)
        view = self.menuBar().addMenu("&View")
        view.addAction(self.memory_action)
        conversation = self.menuBar().addMenu("&Conversation")
        conversation.addAction(self.regenerate_action)

    def _wire(self) -> None:
        c = self.controller
        c.modelStateChanged.connect(self._model_state)
        c.openingChanged.connect(self.status.set_opening)
        c.newPending.connect(self._new_pending)
        self.status.cancelRebuild.connect(c.cancel_rebuild)
        c.modelInfoChanged.connect(self.status.set_model_info)
        c.currentChanged.connect(self._current_changed)
        c.titleChanged.connect(self._title_changed)
        c.messagesReset.connect(self.chat.reset)
        c.messageAdded.connect(self.chat.add)
        c.messagesTruncated.connect(self.chat.truncate)
        c.generatingChanged.connect(self.chat.set_busy)
        c.exported.connect(lambda path: self.status.showMessage(f"Exported to {path}", 5000))
        self.chat.regenerateRequested.connect(lambda: c.regenerate())
        self.chat.editRequested.connect(self.edit_message)
        self.chat.forkRequested.connect(c.fork_message)
        self.chat.deleteRequested.connect(self.delete_message)
        c.replyProgress.connect(self.chat.update_streaming)
        c.replyFinished.connect(self.chat.finish)
        c.generatingChanged.connect(self.input.set_generating)
        c.generatingChanged.connect(self.status.set_generating)
        c.statsChanged.connect(self.status.set_stats)
        c.statsChanged.connect(self.memory.set_stats)
        c.writingChanged.connect(self.memory.set_writing)
        c.turnMetrics.connect(self.status.set_metrics)
        c.prefillProgress.connect(self.status.set_prefill)
        c.rebuildProgress.connect(self.status.set_rebuild)
        c.rebuildProgress.connect(self.chat.show_rebuild)
        c.recallModelChanged.connect(self.chat.show_first_start)
        c.recallModelChanged.connect(self.status.set_recall_model)
        c.attachmentsChanged.connect(self.input.set_attachments)
        c.errorRaised.connect(lambda text: self.banner.show_message(text, topic=c.error_topic))
        c.warningRaised.connect(self.banner.show_warning)
        c.errorResolved.connect(self.banner.resolve)
        c.settingsFailed.connect(self._settings_failed)
        c.settingsApplied.connect(self._settings_applied)
        c.draftReturned.connect(self._draft_returned)
        c.settingsApplied.connect(lambda s: setattr(self.status, "high_watermark", s.high_watermark))
        self.endpoint = EndpointSwitch(self)
        self.endpoint.addressChanged.connect(self.status.set_endpoint)
        self.endpoint.addressChanged.connect(lambda address: address and self.banner.resolve("endpoint"))
        self.endpoint.failed.connect(lambda text: self.banner.show_message(text, topic="endpoint"))
        c.settingsApplied.connect(lambda s: self.endpoint.apply(c.engine, s))
        c.modelInfoChanged.connect(lambda _: self.endpoint.apply(c.engine, c.settings))
        c.bridge.closing.connect(self.endpoint.stop)
        self.sidebar.newRequested.connect(c.new_conversation)
        self.sidebar.activated.connect(c.open_conversation)
        self.sidebar.renameRequested.connect(self.rename_conversation)
        self.sidebar.deleteRequested.connect(self.delete_conversation)
        self.sidebar.pinRequested.connect(c.pin_conversation)
        self.sidebar.hits.searchRequested.connect(c.search)
        self.sidebar.hits.hitChosen.connect(c.open_hit)
        c.searchResults.connect(self.sidebar.hits.set_hits)
        c.messageRevealed.connect(self.chat.reveal)
        self.input.submitted.connect(self.send)
        self.input.draftSettled.connect(c.draft_settled)
        self.input.draftTyped.connect(c.draft_typed)
        self.input.stopClicked.connect(c.stop)
        self.input.attachClicked.connect(self.attach_files)
        self.input.removeAttachment.connect(c.remove_attachment)
        self.input.prompt.filesDropped.connect(self.attach_paths)
        self.input.prompt.largePaste.connect(self.offer_paste_as_file)
        self.input.set_ready(False)

    # -- reactions --------------------------------------------------------------------------
    def _model_state(self, state: str, detail: str) -> None:
        self.status.set_model_state("read-only" if state == "failed" and self.controller.read_only else state,
                                    detail)
        self.input.set_ready(state in ("ready", "unloaded", "loading"))    # while loading, a message waits

    def _settings_failed(self, text: str) -> None:
        """In the settings dialog while it is open (not behind it), else in the banner."""
        dialog = self.settings_dialog
        if dialog is not None and dialog.isVisible():
            dialog.result_failed(text)
        else:
            self.banner.show_message(text, topic="settings")

    def _settings_applied(self, _settings: Any) -> None:
        if self.settings_dialog is not None:
            self.settings_dialog.result_applied()

    def _draft_returned(self, text: str) -> None:
        if not self.input.prompt.toPlainText().strip():
            self.input.prompt.setPlainText(text)

    def _current_changed(self, conversation_id: str, title: str) -> None:
        self._swap_draft(conversation_id)
        self._title_changed(conversation_id, title)
        self.sidebar.set_current(conversation_id)
        self.input.prompt.setFocus(Qt.FocusReason.OtherFocusReason)

    def _swap_draft(self, conversation_id: str) -> None:
        """Each conversation keeps its own draft: the one left is put aside, the one shown comes back. A draft typed
        while a new conversation was being created ("") stays in the box: it is that conversation's."""
        left = self._shown_id
        self._shown_id = conversation_id
        if left == conversation_id or not left:
            return
        text = self.input.prompt.toPlainText()
        if text:
            self._drafts[left] = text
        else:
            self._drafts.pop(left, None)
        self.input.prompt.setPlainText(self._drafts.pop(conversation_id, ""))

    def _new_pending(self, title: str) -> None:
        """New was asked: the pane is the new conversation already (the engine creates it behind its work)."""
        self._current_changed("", title)

    def _title_changed(self, _conversation_id: str, title: str) -> None:
        self.title.setText(title)
        self.setWindowTitle(f"{title} — Evoke Desk")

    # -- user actions -----------------------------------------------------------------------
    def focus_search(self) -> None:
        self.sidebar.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.sidebar.search.selectAll()

    def send(self, text: str) -> None:
        if self.controller.send(text):
            self.input.clear()
            self.banner.hide()

    def edit_message(self, position: int) -> None:
        if not 0 <= position < len(self.controller.messages):
            return
        text = self.edit_text(self, "Edit message", "The message (later messages are replaced):",
                              self.controller.messages[position].text)
        if text is not None and self.controller.edit_message(position, text):
            self.banner.hide()

    def delete_message(self, position: int) -> None:
        if self.confirm(self, "Delete message", "Delete this message from the conversation?", "Delete"):
            self.controller.delete_message(position)

    def export_conversation(self) -> None:
        if self.controller.conv is None:
            return
        stem = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in self.controller.title).strip()
        path = self.save_export(self, f"{stem or 'conversation'}.md")
        if path:
            self.controller.export_conversation(path)

    def import_conversation(self) -> None:
        picked = self.pick_import(self)                 # the files to import (or one path)
        if picked:
            self.controller.import_conversations([picked] if isinstance(picked, str) else list(picked))

    def attach_files(self) -> None:
        self.attach_paths(self.pick_files(self))

    def attach_paths(self, paths: list[str]) -> None:
        for path in paths:
            self.controller.attach_file(path)

    def offer_paste_as_file(self, text: str) -> None:
        lines = text.count("\n") + 1
        if self.confirm(self, "Large paste", f"The pasted text has {len(text):,} characters in {lines} lines.\n"
                        "Attach it as a file? (It becomes file blocks the memory manager can evict and "
                        "recover.)", "Attach as file"):
            self.controller.attach_paste(text)
        else:
            self.input.prompt.insertPlainText(text)

    def rename_conversation(self, conversation_id: str) -> None:
        row = self.controller.conversations.row_of(conversation_id)
        old = self.controller.conversations.rows[row].title if row >= 0 else ""
        title = self.ask_text(self, "Rename conversation", "Title:", old)
        if title:
            self.controller.rename_conversation(conversation_id, title)

    def delete_conversation(self, conversation_id: str) -> None:
        row = self.controller.conversations.row_of(conversation_id)
        title = self.controller.conversations.rows[row].title if row >= 0 else "this conversation"
        if self.confirm(self, "Delete conversation", f"Delete “{title}” and its saved memory? "
                        "This cannot be undone.", "Delete"):
            self.controller.delete_conversation(conversation_id)
        self.input.prompt.setFocus(Qt.FocusReason.OtherFocusReason)

    def open_settings(self) -> SettingsDialog:
        prefix, minimum = self.controller.budget_floor()
        dialog = SettingsDialog(self.controller.settings, self, model_info=self.controller.model_info,
                                min_budget=minimum, prefix_tokens=prefix)
        dialog.wait_for_result = True
        dialog.applied.connect(self.controller.apply_settings)
        self.controller.measure_kv_disk(dialog.show_disk_use)    # KV disk use beside its cap
        self.settings_dialog = dialog
        dialog.open()
        return dialog

    # -- drag and drop ----------------------------------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            self.attach_paths(paths)
            event.acceptProposedAction()

    def _layout_store(self) -> QSettings:
        path = self.controller.settings.config_dir / "window.ini"
        return QSettings(str(path), QSettings.Format.IniFormat)

    def _restore_layout(self) -> None:
        store = self._layout_store()
        if store.contains("geometry"):
            self.restoreGeometry(store.value("geometry"))
            self.restoreState(store.value("state"))

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        store = self._layout_store()
        store.setValue("geometry", self.saveGeometry())
        store.setValue("state", self.saveState())
        store.sync()
        self.controller.stop_all()
        self.closed.emit()
        super().closeEvent(event)

    def grab_after(self, ms: int, path: str, widget: Any = None, then: Any = None) -> None:
        """Save a PNG of `widget` (the window by default) after `ms`, then call `then`."""
        def shoot() -> None:
            (widget or self).grab().save(path)
            if then is not None:
                then()
        QTimer.singleShot(ms, shoot)
