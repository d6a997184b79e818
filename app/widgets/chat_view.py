"""The conversation as a column of message bubbles: Markdown, highlighted code, copy links, hover
actions on each message (copy, regenerate, edit, fork, delete), a version switch, and under a reply
that ended short why, with Continue generating (`reply_end`).

Invariants: only the last bubble is re-rendered while a reply streams (its parts are updated in
place, not rebuilt); a reply's text and its code blocks are separate widgets, so a long code line
scrolls inside its block and never widens the message; every part wraps to the chat's width (the hover
actions fold into a "⋯" menu where their row does not fit), so the chat never scrolls sideways; the view
follows the bottom unless the user scrolled up, and keeps its place when the text changes size (`keep_place`);
actions are emitted with the bubble's position (the controller maps it to the engine's message), and only copy
acts here. Ctrl+wheel anywhere over the chat asks for another text size (`zoomRequested`): no part zooms itself.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QWheelEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from ..messages import ChatMessage, Versions, end_note, stamp_text
from ..render import Part, render_parts, render_plain
from .code_block import CodeBlockView, pass_zoom_wheel
from .message_actions import MessageActions
from .reply_end import ReplyEnd
from .version_switch import VersionSwitch


def open_web_link(url: QUrl) -> None:
    if url.scheme() in ("http", "https", "mailto"):
        QDesktopServices.openUrl(url)


class AutoHeightBrowser(QTextBrowser):
    """A QTextBrowser as tall as its document, so the outer scroll area does the scrolling; a web link in it
    opens in the desktop's browser (nothing else is followed)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.anchorClicked.connect(open_web_link)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(self.verticalScrollBarPolicy().ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(self.horizontalScrollBarPolicy().ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _fit(self, *_: object) -> None:
        height = int(self.document().size().height()) + 4
        if self.height() != height:
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self.document().setTextWidth(self.viewport().width())
        self._fit()

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802
        if not pass_zoom_wheel(event):
            super().wheelEvent(event)


COPIED_MS = 1500          # how long the copy button says "Copied ✓"
ACTIONS = (("copy", "Copy", "Copy the message"), ("regenerate", "Regenerate", "A new reply (Ctrl+Shift+R)"),
           ("edit", "Edit", "Edit and resend; later messages go"), ("fork", "Fork", "A new conversation up to here"),
           ("delete", "Delete", "Delete this message"))


class MessageBubble(QFrame):
    """One message: a role header with hover actions, the rendered body, attachment chips, a footer."""

    actionTriggered = Signal(str)      # copy | regenerate | edit | fork | delete | continue

    def __init__(self, message: ChatMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = message.role
        self.source = message.text
        self.code_blocks: list[str] = []
        self._rendered: tuple[str, bool] | None = None     # (text, streaming) the parts show now
        self.is_last = False
        self.busy = False
        self.setObjectName("bubble_" + message.role)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        layout.setSpacing(4)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        self.header = QLabel("You" if message.role == "user" else "Assistant", objectName="bubbleHeader")
        top.addWidget(self.header)
        self.stamp = QLabel(objectName="bubbleTime")          # when it was written, local time
        top.addWidget(self.stamp, 1)
        self.actions = MessageActions(ACTIONS)       # a row of buttons, or "⋯" where the bubble is narrow
        self.actions.triggered.connect(self.actionTriggered)
        self.buttons = self.actions.buttons
        policy = self.actions.sizePolicy()
        policy.setRetainSizeWhenHidden(True)         # no jump when the actions show on hover
        self.actions.setSizePolicy(policy)
        self.actions.hide()
        self.versions = VersionSwitch(self)          # "‹ 2/3 ›" when the message has earlier versions
        top.addWidget(self.versions)
        top.addWidget(self.actions)
        layout.addLayout(top)
        self.chips = QLabel(objectName="attachmentLine")
        self.chips.setWordWrap(True)
        layout.addWidget(self.chips)
        self.body = AutoHeightBrowser(self)          # the first part: the whole text when there is no code
        self.body.setObjectName("bubbleBody")
        self.parts: list[QWidget] = [self.body]
        self.part_column = QVBoxLayout()
        self.part_column.setContentsMargins(0, 0, 0, 0)
        self.part_column.setSpacing(2)
        self.part_column.addWidget(self.body)
        layout.addLayout(self.part_column)
        self.footer = QLabel(objectName="bubbleFooter")
        self.footer.setWordWrap(True)                # a long footer wraps, never widens the bubble
        layout.addWidget(self.footer)
        self.reply_end = ReplyEnd(self)              # why a reply ended short, and "Continue generating"
        self.reply_end.continueClicked.connect(lambda: self.actionTriggered.emit("continue"))
        layout.addWidget(self.reply_end)
        self._copied_reset = QTimer(self, singleShot=True, interval=COPIED_MS,
                                    timeout=lambda: self.actions.set_label("copy", "Copy"))
        self.set_message(message)

    def set_message(self, message: ChatMessage) -> None:
        self.message = message
        self.source = message.text
        self.set_text(message.text, streaming=False)
        self.chips.setText("   ".join(f"▣ {n}" + (f"  ({size:,} chars)" if size else "")
                                       for n, size in message.attachments))
        self.chips.setVisible(bool(message.attachments))
        self.footer.setText(message.meta)
        self.footer.setVisible(bool(message.meta))
        self.reply_end.set_note(end_note(message), always=message.interrupted)
        self.row_id = message.row_id
        self.stamp.setText(f"·  {stamp_text(message.created_at)}" if message.created_at else "")
        self.stamp.setToolTip(time.strftime("%A %d %B %Y, %H:%M:%S", time.localtime(message.created_at))
                              if message.created_at else "")

    def show_copied(self) -> None:
        """Say on the copy button that the message is on the clipboard, for a moment."""
        self.actions.set_label("copy", "Copied ✓")
        self._copied_reset.start()

    def set_text(self, text: str, *, streaming: bool) -> None:
        if self._rendered == (text, streaming):        # unchanged: a selection in it stays
            return
        self._rendered = (text, streaming)
        if self.role == "user":
            self.body.setHtml(render_plain(text))
            return
        parts = render_parts(text + (" ▍" if streaming else "")) or [Part("html", "<p style='color:#7d8590;'>…</p>")]
        self.code_blocks = [p.code for p in parts if p.kind == "code"]
        self._show_parts(parts)

    def _show_parts(self, parts: list[Part]) -> None:
        """Update the part widgets in place; a part of another kind (or a new one) gets a new widget."""
        if parts[0].kind == "code":                   # the body is always a text part
            parts = [Part("html", ""), *parts]
        keep = 0
        while keep < min(len(parts), len(self.parts)) and (parts[keep].kind == "code") == isinstance(
                self.parts[keep], CodeBlockView):
            keep += 1
        for widget in self.parts[max(keep, 1):]:
            widget.setParent(None)
            widget.deleteLater()
        del self.parts[max(keep, 1):]
        code_index = 0
        for i, part in enumerate(parts):
            if i >= len(self.parts):
                widget = CodeBlockView(code_index) if part.kind == "code" else AutoHeightBrowser(self)
                if isinstance(widget, AutoHeightBrowser):
                    widget.setObjectName("bubbleBody")
                self.parts.append(widget)
                self.part_column.addWidget(widget)
            widget = self.parts[i]
            if isinstance(widget, CodeBlockView):
                widget.index = code_index
                widget.set_code(part.code, part.lang, part.html)
                code_index += 1
            else:
                widget.setHtml(part.html)
                widget.setVisible(bool(part.html) or i == 0 and len(parts) == 1)

    def code_views(self) -> list[CodeBlockView]:
        return [w for w in self.parts if isinstance(w, CodeBlockView)]

    def text(self) -> str:
        pieces = [w.code if isinstance(w, CodeBlockView) else w.toPlainText() for w in self.parts]
        return "\n".join(piece for piece in pieces if piece)

    def set_place(self, *, is_last: bool, busy: bool) -> None:
        """Which actions apply: regenerate and Continue on the last reply, edit on every message, none but copy
        while busy or while a version switch is pending."""
        self.is_last, self.busy = is_last, busy
        self.actions.set_applies("regenerate", self.role == "assistant" and is_last)
        self.buttons["edit"].setToolTip("Edit and resend; later messages go to the old version's branch"
                                        if self.role == "user" else "Edit the reply's text")
        for name in ("regenerate", "edit", "fork", "delete"):
            self.buttons[name].setEnabled(not busy and not self.versions.switching)   # a version switch pending
        self.versions.set_busy(busy)
        self.reply_end.offer(is_last and not busy and not self.versions.switching)

    def show_actions(self, shown: bool) -> None:
        if not shown and self.actions.menu.isVisible():      # the "⋯" menu is open: its row stays
            return
        self.actions.setVisible(shown)

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Enter:
            parent = self.parentWidget()             # a Leave can be lost (a dialog, a scroll): one bubble at a time
            for other in parent.findChildren(MessageBubble) if parent is not None else []:
                if other is not self:
                    other.show_actions(False)
            self.show_actions(True)
        elif event.type() == QEvent.Type.Leave:
            self.show_actions(False)
        return super().event(event)


class ChatView(QScrollArea):
    """The scrolling column of bubbles for the open conversation."""

    codeCopied = Signal(int)
    regenerateRequested = Signal()
    continueRequested = Signal()         # the last reply's "Continue generating"
    versionRequested = Signal(int, int)  # the message's position, the history row id of the version to make current
    editRequested = Signal(int)          # the message's position in the view
    forkRequested = Signal(int)
    deleteRequested = Signal(int)
    messageCopied = Signal(int)
    zoomRequested = Signal(int)          # Ctrl+wheel over the chat: +1 bigger text, -1 smaller

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setObjectName("chatView")
        inner = QWidget(objectName="chatColumn")
        self.column = QVBoxLayout(inner)
        self.column.setContentsMargins(24, 16, 24, 16)
        self.column.setSpacing(12)
        self.column.addStretch(1)
        self.setWidget(inner)
        self.placeholder = QLabel("Start a conversation: type below, attach files with the paper clip "
                                  "or drop them here.", objectName="placeholder")
        self.placeholder.setWordWrap(True)
        self.column.insertWidget(0, self.placeholder)
        self.notice = QLabel(objectName="chatNotice")         # a rebuild in progress, said in the chat
        self.notice.setWordWrap(True)
        self.notice.hide()
        self.column.insertWidget(1, self.notice)
        self.first_start = QLabel(objectName="firstStart")    # the first start: what is being prepared, and why
        self.first_start.setWordWrap(True)
        self.first_start.hide()
        self.column.insertWidget(0, self.first_start)
        self.bubbles: list[MessageBubble] = []
        self._revealed: MessageBubble | None = None      # a search hit's bubble, kept in view until the next change
        self._anchor: tuple[MessageBubble, float] | None = None   # the bubble at the top and how far into it
        self._wheel_zoom = 0                             # Ctrl+wheel's angle not yet turned into a step
        self.busy = False
        self._follow = True
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        self.verticalScrollBar().actionTriggered.connect(self._user_scrolled)   # wheel, keys, the bar: not ours

    def show_first_start(self, state: str, first_use: bool, _message: str = "") -> None:
        """On the first start (the recall model exported for its first use), say what is happening above the
        chat until it is ready: chatting works meanwhile."""
        if state != "warming" or not first_use:
            self.first_start.hide()
            return
        self.first_start.setText(
            "Welcome to Evoke Desk. The model is loaded: you can chat now.\n\n"
            "One thing is still being prepared, once only: the recall model, which finds the older parts of a long "
            "conversation a new message needs (it takes up to a minute on this first start, a second on later "
            "ones). Until it is ready, recall matches words instead of meaning; nothing waits for it.")
        self.first_start.show()

    def show_rebuild(self, title: str, done: int, total: int) -> None:
        """Say in the chat that a conversation's memory is being rebuilt from its history; gone when done."""
        if done >= total:
            self.notice.hide()
            self.placeholder.setVisible(not self.bubbles)
            return
        self.placeholder.hide()
        self.notice.setText(f"Rebuilding the memory of “{title}” from its history (no saved cache fits it): "
                            f"{done:,} / {total:,} tokens. It answers once this is done; nothing is lost.")
        self.notice.show()

    def reset(self, messages: list[ChatMessage]) -> None:
        """Show exactly `messages`. A bubble already at its place with the same role stays the same widget (a
        conversation that finishes opening re-sends what is shown: what a user reads, selects or copies from is
        not rebuilt); it is re-rendered only where its message changed."""
        kept = 0
        while kept < min(len(messages), len(self.bubbles)) and self.bubbles[kept].role == messages[kept].role:
            bubble = self.bubbles[kept]
            if bubble.message != messages[kept]:
                if (bubble.message.row_id, bubble.message.text) != (messages[kept].row_id, messages[kept].text):
                    bubble.versions.set_versions(None)      # another message: its versions come with it
                bubble.set_message(messages[kept])
            kept += 1
        self.truncate(kept)
        for message in messages[kept:]:
            self.add(message)
        self.placeholder.setVisible(not messages)
        self._place_actions()
        self._follow = True
        self._revealed = self._anchor = None

    def add(self, message: ChatMessage) -> MessageBubble:
        self._revealed = self._anchor = None
        bubble = MessageBubble(message)
        bubble.actionTriggered.connect(lambda name, bubble=bubble: self._action(bubble, name))
        bubble.versions.chosen.connect(lambda row_id, bubble=bubble: bubble in self.bubbles and
                                       self.versionRequested.emit(self.bubbles.index(bubble), row_id))
        self.column.insertWidget(self.column.count() - 1, bubble)
        self.bubbles.append(bubble)
        self.placeholder.setVisible(False)
        self._place_actions()
        return bubble

    def reveal(self, position: int) -> None:
        """Scroll to bubble `position` (a search hit) and keep it in view while the column lays out."""
        if not 0 <= position < len(self.bubbles):
            return
        self._revealed, self._anchor = self.bubbles[position], None
        self._follow = False
        self.ensureWidgetVisible(self._revealed, 0, 40)

    def truncate(self, position: int) -> None:
        """Drop the bubbles from `position` on (an edit or a regenerate replaces them)."""
        for bubble in self.bubbles[position:]:
            bubble.setParent(None)
            bubble.deleteLater()
        del self.bubbles[position:]
        self._place_actions()

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._place_actions()

    def set_versions(self, versions: dict[int, Versions]) -> None:
        """The versions of the messages at these positions (oldest first); the others have none."""
        for position, bubble in enumerate(self.bubbles):
            bubble.versions.set_versions(versions.get(position))

    def _place_actions(self) -> None:
        for i, bubble in enumerate(self.bubbles):
            bubble.set_place(is_last=i == len(self.bubbles) - 1, busy=self.busy)

    def _action(self, bubble: MessageBubble, name: str) -> None:
        if bubble not in self.bubbles:
            return
        position = self.bubbles.index(bubble)
        if name == "copy":
            QGuiApplication.clipboard().setText(bubble.source)
            bubble.show_copied()
            self.messageCopied.emit(position)
        elif name == "regenerate":
            self.regenerateRequested.emit()
        elif name == "continue":
            self.continueRequested.emit()
        else:
            {"edit": self.editRequested, "fork": self.forkRequested, "delete": self.deleteRequested}[name].emit(
                position)

    def update_streaming(self, text: str) -> None:
        if self.bubbles and self.bubbles[-1].role == "assistant":
            self.bubbles[-1].source = text
            self.bubbles[-1].set_text(text, streaming=True)

    def finish(self, message: ChatMessage) -> None:
        if self.bubbles and self.bubbles[-1].role == "assistant":
            self.bubbles[-1].set_message(message)

    def last_text(self) -> str:
        return self.bubbles[-1].text() if self.bubbles else ""

    def keep_place(self) -> None:
        """The text is about to change size: the bubble at the top of the view stays there (as far into it, in
        share of its height) while the column lays out again, until the user scrolls or the messages change. At
        the bottom the view stays at the bottom; a search hit shown stays in view."""
        self._anchor = None
        if self._follow or self._revealed is not None:
            return
        top = self.verticalScrollBar().value()
        bubble = next((b for b in self.bubbles if b.geometry().bottom() >= top), None)
        if bubble is not None:
            self._anchor = (bubble, (top - bubble.y()) / max(1, bubble.height()))

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802
        if not event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            super().wheelEvent(event)
            return
        self._wheel_zoom += event.angleDelta().y()          # a touchpad sends small deltas: a step per notch
        while abs(self._wheel_zoom) >= 120:
            direction = 1 if self._wheel_zoom > 0 else -1
            self._wheel_zoom -= 120 * direction
            self.zoomRequested.emit(direction)
        event.accept()

    def _user_scrolled(self, _action: int) -> None:
        self._anchor = None

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 8

    def _range_changed(self, _low: int, high: int) -> None:
        if self._revealed is not None and self._revealed in self.bubbles:
            self.ensureWidgetVisible(self._revealed, 0, 40)
        elif self._anchor is not None and self._anchor[0] in self.bubbles:
            bubble, share = self._anchor
            self.verticalScrollBar().setValue(bubble.y() + round(share * bubble.height()))
        elif self._follow:
            self.verticalScrollBar().setValue(high)
