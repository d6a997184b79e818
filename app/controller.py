"""The app's state, headless: the open conversation, its messages, the streaming reply, models.

Invariants: widgets only call these methods and listen to these signals; every engine call
goes through the bridge (never on the GUI thread); one reply streams at a time. The highlighted
conversation (`conv`) changes at once on a click or New; its KV opens (restored or rebuilt from
history) in the background, and a message sent meanwhile is shown there and waits in `queued`
(at most one per conversation) until its conversation is open, the model ready and no reply streams.
A conversation left without a message is deleted (empty conversations are not kept).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from evoke_engine import Conversation, min_budget_tokens, read_conversations, read_messages
from evoke_engine.errors import DataDirInUseError, RebuildCancelled
from evoke_engine.events import EventKind

from .attachments import AttachmentError, paste_name, read_text_attachment
from .bridge import EngineBridge, error_text
from .editing_flow import EditingFlow
from .exchange_flow import ExchangeFlow
from .item_models import BlockTableModel, ConversationListModel, EventLogModel
from .last_open import LastConversation, startup_choice
from .messages import DEFAULT_TITLES, ChatMessage, Stream, model_name, reply_meta, title_from
from .search_flow import SearchFlow
from .settings_flow import SettingsFlow
from .versions_flow import VersionsFlow

log = logging.getLogger(__name__)
STATE_OF_EVENT = {EventKind.EVICTED: "ram", EventKind.SPILLED: "disk", EventKind.RECOVERED: "resident"}
MEMORY_EVENTS = {EventKind.EVICTED, EventKind.RECOVERED, EventKind.SPILLED, EventKind.KV_PERSISTED,
                 EventKind.KV_RESTORED, EventKind.KV_REBUILT, EventKind.PARKED, EventKind.BLOCKS_REUSED,
                 EventKind.ERROR}
EVENTS_KEPT = 300
# What clears an error in the banner: "model" when a model loads, "settings" when settings apply,
# "" (an action in a conversation: an import, a reply) when another conversation opens.
ERROR_TOPICS = ("model", "settings", "")
WAITING_NOTE = "Waiting for the model: this message is sent as soon as it is ready."
REBUILD_NOTE = "Waiting for this conversation to be rebuilt from its history: the message is sent when it is."
LIVE_STATS_MS = 500                            # stats refresh period while a reply streams
GENERATING_POLL_MS = 1000                      # how often the sidebar asks which conversations the endpoint writes in


@dataclass
class QueuedMessage:
    """A message on screen that waits to be sent (for the model, its conversation's KV, or another reply)."""

    conversation_id: str                       # "" while its conversation is being created (New)
    text: str
    attachments: list[tuple[str, str]]
    options: dict[str, Any]
    entered_at: float = field(default_factory=time.perf_counter)    # when the user sent it (its first-token clock)
    sent_at: float = field(default_factory=time.time)                # the same, as the bubble's time


def _rows_beside(stream: Stream, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[ChatMessage]]:
    """A conversation's stored rows as shown beside its reply being written: the reply's own row (in flight) leaves,
    its bubble follows the stream; the message it answers is shown from the stream until its turn stores it."""
    asked_at = stream.question.created_at if stream.question is not None else 0.0
    last = rows[-1] if rows else {}
    if last.get("role") == "assistant" and last.get("interrupted") and float(last.get("created_at") or 0) >= asked_at:
        rows = rows[:-1]
    stored = stream.question is None or any(r.get("role") == "user" and float(r.get("created_at") or 0) >= asked_at
                                            for r in rows)
    return rows, [] if stored else [stream.question]


class ChatController(SettingsFlow, EditingFlow, ExchangeFlow, SearchFlow, VersionsFlow, QObject):
    modelStateChanged = Signal(str, str)       # loading | ready | failed | unloaded, detail
    modelInfoChanged = Signal(object)
    currentChanged = Signal(str, str)          # conversation id, title (another conversation opened)
    titleChanged = Signal(str, str)            # conversation id, new title of the open conversation
    messagesReset = Signal(list)               # [ChatMessage]
    messageAdded = Signal(object)              # ChatMessage
    messagesTruncated = Signal(int)            # messages from this position on left the view
    exported = Signal(str)                     # the path an export was written to
    replyProgress = Signal(str)                # the streaming reply so far
    replyFinished = Signal(object)             # the final ChatMessage
    generatingChanged = Signal(bool)
    statsChanged = Signal(dict)
    turnMetrics = Signal(float, float)         # time to first token (s), tokens/s
    prefillProgress = Signal(int, str)         # tokens done, message
    rebuildProgress = Signal(str, int, int)    # title of the conversation rebuilt from history, done, total tokens
    attachmentsChanged = Signal(list)          # [(name, characters)]
    settingsApplied = Signal(object)
    errorRaised = Signal(str)                  # its topic is `error_topic` while the signal is delivered
    warningRaised = Signal(str)                # engine-wide warnings (e.g. a setting that may not fit)
    errorResolved = Signal(str)                # the cause of errors of this topic is gone (ERROR_TOPICS)
    settingsFailed = Signal(str)               # applying settings failed (the settings dialog shows it)
    draftReturned = Signal(str)                # a queued message that could not be sent goes back to the box
    versionsChanged = Signal(object)           # {view position: [its versions' texts, oldest first]}
    undoChanged = Signal(str)                  # what an undo would bring back ("" when nothing)
    searchResults = Signal(str, list)          # query, [SearchHit] (app/search_flow.py)
    messageRevealed = Signal(int)              # position of the message a search hit opened
    openingChanged = Signal(str)               # title of the conversation whose KV is opening ("" once it is open)
    newPending = Signal(str)                   # New was asked: the pane is the new conversation (title) until it exists
    conversationSettled = Signal(str)          # the highlighted conversation's messages are shown and its KV is open
    writingChanged = Signal(list)              # titles of the conversations whose reply is being written now
    recallModelChanged = Signal(str, bool, str)   # warming | ready | failed, first use (exported first), its words

    def __init__(self, bridge: EngineBridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.settings = bridge.settings
        self.conversations = ConversationListModel(self)
        self.blocks = BlockTableModel(self)
        self.events = EventLogModel(parent=self)
        self.model_info: Any = None
        self.model_state = "loading"
        self.conv: Any = None
        self.messages: list[ChatMessage] = []
        self.pending: list[tuple[str, str]] = []
        self.queued: list[QueuedMessage] = []      # shown in their conversations, sent once they can be
        self.viewed_id = ""                        # the conversation shown read-only before any model loaded
        self.history_loaded = False                # the open conversation's messages are on screen
        self.opening_ids: set[str] = set()         # conversations whose KV the engine is opening (maybe rebuilding)
        self.unopened_ids: set[str] = set()        # their open was cancelled or failed: a message opens them again
        self._cancel_asked: set[str] = set()       # the user pressed Cancel on their rebuild
        self.creating = False                      # New was asked and its conversation does not exist yet
        self.read_only = False                     # another process owns the data folder
        self._writing_names: list[str] = []            # what `writingChanged` said last
        self._recall_said: tuple[str, str] | None = None   # the recall model's state last said, and its words
        self._recall_first_use = False
        self._drop_after_switch = ""               # an empty conversation that was left: deleted once the next shows
        self._made_here: set[str] = set()          # made by New and shown before its (empty) history was read back
        self.error_topic = ""
        self.streams: dict[str, Stream] = {}       # conversation id -> its reply being written (several at once)
        self.stats: Any = None                     # the open conversation's ConversationStats, once it lands
        self.title = ""
        self.last_open = LastConversation(self.settings.config_dir)   # reopened at the next start-up
        self._event_log: dict[str, deque[tuple[str, str, float]]] = defaultdict(lambda: deque(maxlen=EVENTS_KEPT))
        self._stats_busy = self._stats_dirty = False
        self._flush = QTimer(self, singleShot=True, interval=40, timeout=self._emit_progress)
        self._stats_timer = QTimer(self, singleShot=True, interval=150, timeout=self.refresh_stats)
        self._list_timer = QTimer(self, interval=5000, timeout=self.refresh_conversations)
        # while a reply streams the memory panel and the KV gauge follow it at a bounded rate
        self._live_stats = QTimer(self, interval=LIVE_STATS_MS, timeout=self.refresh_stats)
        self.generatingChanged.connect(lambda on: self._live_stats.start() if on else self._live_stats.stop())
        self._generating_poll = QTimer(self, interval=GENERATING_POLL_MS, timeout=self.mark_generating)
        bridge.modelLoading.connect(lambda: self._set_model_state("loading", "Loading model…"))
        bridge.modelReady.connect(self._model_ready)
        bridge.modelFailed.connect(self._model_failed)
        bridge.engineEvent.connect(self._on_event)
        bridge.token.connect(self._on_token)
        bridge.error.connect(self.raise_error)
        bridge.closing.connect(self._shutdown)

    # -- model ------------------------------------------------------------------------------
    @property
    def engine(self) -> Any:
        return self.bridge.engine

    @property
    def stream(self) -> Stream | None:
        """The reply being written in the shown conversation, if any."""
        return self.streams.get(self.current_id) if self.current_id else None

    @property
    def generating(self) -> bool:
        """The shown conversation's reply is being written (its Stop shows; other conversations may generate too)."""
        return self.stream is not None

    @property
    def current_id(self) -> str:
        return str(self.conv.id) if self.conv is not None else ""

    @property
    def settled(self) -> bool:
        """The highlighted conversation has finished opening: its messages are on screen (no reset of the chat
        view follows) and the engine holds its KV (or gave up opening it)."""
        return self.conv is not None and self.history_loaded and self.current_id not in self.opening_ids

    def _say_if_settled(self) -> None:
        if self.settled:
            self.conversationSettled.emit(self.current_id)

    def start(self) -> None:
        self.report_settings_file()                # saved values not used: the banner names them (SettingsFlow)
        self.bridge.start()
        self.read_history_without_model(early=True)   # the list and the last conversation show while the model loads

    def _shutdown(self) -> None:
        for timer in (self._flush, self._stats_timer, self._list_timer, self._live_stats, self._generating_poll):
            timer.stop()

    def mark_generating(self) -> None:
        """The sidebar marks every conversation whose reply is being written: the window's own and the endpoint's
        (asked of the engine, which answers from any thread without waiting for its own)."""
        writing = set(self.streams)
        ask = getattr(self.engine, "generating", None) if self.model_state == "ready" else None
        if ask is not None:
            writing |= set(ask())
        self.conversations.set_generating(writing)
        rows = [r for r in self.conversations.rows if r.id in writing]
        names = [r.title + ("" if r.source == "app" else f" ({r.source})") for r in rows]
        names += ["a conversation not listed yet"] * (len(writing) - len(rows))
        if names != self._writing_names:
            self._writing_names = names
            self.writingChanged.emit(names)

    def _set_model_state(self, state: str, detail: str = "") -> None:
        self.model_state = state
        self.modelStateChanged.emit(state, detail)
        if state == "ready":
            self._generating_poll.start()
        self.mark_generating()
        if state in ("ready", "unloaded"):
            self._send_next_queued()

    def raise_error(self, text: str, topic: str = "") -> None:
        """Show `text` in the banner; it clears when `errorResolved(topic)` says its cause is gone."""
        self.error_topic = topic
        try:
            self.errorRaised.emit(text)
        finally:
            self.error_topic = ""

    def _model_ready(self, info: Any) -> None:
        first = self.model_info is None
        self.model_info = info
        self.modelInfoChanged.emit(info)
        self._set_model_state("ready", model_name(info))
        status = getattr(self.engine, "embedder_status", None)
        if status is not None and status() is not None:      # it began before this window listened
            self._recall_model(status())
        self.errorResolved.emit("model")
        self._list_timer.start()
        if first:
            self.openingChanged.emit("the last conversation")   # "Ready" only once it has reopened
            self.check_budget_floor()              # a saved budget below the smallest that works (SettingsFlow)
            self.bridge.call(self.engine.conversations, on_done=self._open_latest, on_error=self._fail)

    def _open_latest(self, infos: list[Any]) -> None:
        self.conversations.set_conversations(infos)
        if self.conv is not None:
            return
        ids = [row.id for row in self.conversations.rows]
        chosen = startup_choice(ids, self.viewed_id, self.last_open.recall())   # the last one shown, if any
        if chosen is not None:
            for queued in self.queued:                  # typed before anything was shown: it goes where we open
                queued.conversation_id = queued.conversation_id or chosen
            self.open_conversation(chosen)
        elif not self.budget_below_floor:
            self.new_conversation()
        else:                                       # it would be refused: the banner says where to raise the budget
            self.openingChanged.emit("")

    def _model_failed(self, message: str) -> None:
        self.read_only = isinstance(self.bridge.load_error, DataDirInUseError)
        self.openingChanged.emit("")
        self._set_model_state("failed", message)
        if self.read_only:                                              # no engine started: the other one owns it
            self.raise_error(f"Evoke Desk cannot start its engine: {message}. This window shows your conversations "
                             "read-only.", "model")
        else:
            self.raise_error(f"The model could not be loaded: {message}. Your conversations stay readable; "
                             "choose a working model in Settings → Model to chat.", "model")
        shown = self.current_id or self.viewed_id
        for queued in self.queued:                  # the waiting messages go back to the box, not lost
            self._return_draft(queued, shown_here=queued.conversation_id in ("", shown))
        self.queued = []
        if self.model_info is None:
            self.read_history_without_model()

    def read_history_without_model(self, *, early: bool = False) -> None:
        """List the conversations from SQLite (no model needed) and show the latest one, read-only; `early`: at
        start-up, beside the model's load (a failure to read is then only logged)."""

        def listed(infos: list[Any]) -> None:
            if self.model_info is not None:
                return
            self.conversations.set_conversations(infos)
            if self.conv is None and not self.viewed_id and self.conversations.rows:
                self._view(startup_choice([r.id for r in self.conversations.rows], "", self.last_open.recall())
                           or self.conversations.rows[0].id)
        def unreadable(exc: BaseException) -> None:
            if early:                              # the engine opens (and repairs) it: it says what is wrong
                log.info("the history could not be read before the model loaded: %s", exc)
            else:
                self._fail_with("Could not read the history", exc)
        self.bridge.call(read_conversations, self.settings, on_done=listed, on_error=unreadable)

    def _return_draft(self, queued: QueuedMessage, *, shown_here: bool) -> None:
        """A waiting message that cannot be sent goes back to the message box (its bubbles leave the chat)."""
        self.pending = queued.attachments + self.pending
        self.attachmentsChanged.emit([(n, len(t)) for n, t in self.pending])
        self.draftReturned.emit(queued.text)
        if shown_here and self.messages[-2:] and self.messages[-1].role == "assistant" and not self.messages[-1].text:
            del self.messages[-2:]
            self.messagesTruncated.emit(len(self.messages))

    def _view(self, conversation_id: str) -> None:
        """Show a conversation's messages from SQLite, read-only (no model has loaded yet)."""

        row = self.conversations.row_of(conversation_id)
        self.viewed_id = conversation_id
        self.title = (self.conversations.rows[row].title if row >= 0 else "") or "Untitled"
        self.errorResolved.emit("")
        self.currentChanged.emit(conversation_id, self.title)

        def shown(rows: list[dict[str, Any]]) -> None:
            if self.conv is not None or conversation_id != self.viewed_id:
                return
            self.messages = [ChatMessage.from_history(r, -1) for r in rows if r.get("role") in ("user", "assistant")]
            self.messagesReset.emit(list(self.messages))
            self.reveal_pending()
        self.bridge.call(read_messages, self.settings, conversation_id, on_done=shown,
                         on_error=lambda exc: self._fail_with("Could not read the conversation", exc))

    def _fail(self, exc: BaseException) -> None:
        self.raise_error(error_text(exc))

    # -- conversations ----------------------------------------------------------------------
    def refresh_conversations(self) -> None:
        if self.engine is not None:
            self.bridge.call(self.engine.conversations, on_done=self.conversations.set_conversations,
                             on_error=lambda exc: log.warning("listing conversations: %s", exc))

    def _engine_or_say(self) -> bool:
        if self.engine is None or self.model_state == "failed":
            self.raise_error(self._no_model_text(), "model")
            return False
        return True

    def _no_model_text(self) -> str:
        if self.model_state == "failed":
            return ("No model is loaded, so nothing can answer: choose a working model in Settings → Model "
                    "(your message is kept).")
        return "The model is still loading; try again in a moment."

    def new_conversation(self) -> None:
        """The pane becomes the new conversation at once (a message written now waits for it); the engine
        creates it behind whatever it is doing. The conversation left is kept only if it has messages."""
        if not self._engine_or_say():
            return
        refused = self.new_conversation_refusal()     # a saved budget below the smallest that works (SettingsFlow)
        if refused:
            self.raise_error(refused, "settings")
            return
        previous = self.conv
        previous_title = self.title
        self._leave()
        self.conv = None
        self.creating = True
        self.history_loaded = True
        self.messages = []
        self.title = "New conversation"
        self.messagesReset.emit([])
        self.newPending.emit(self.title)
        self.generatingChanged.emit(False)
        self.bridge.call(self.engine.new_conversation, on_done=self._created,
                         on_error=lambda exc: self._create_failed(previous, previous_title, exc))

    def _created(self, conv: Any) -> None:
        if not self.creating:                      # the user went elsewhere before it existed
            self._adopt_unassigned(str(conv.id))
            if not any(q.conversation_id == str(conv.id) for q in self.queued):
                self.bridge.call(self.engine.delete_conversation, str(conv.id),
                                 on_done=lambda _: self.refresh_conversations(), on_error=self._fail)
            self._send_next_queued()
            return
        self._adopt_unassigned(str(conv.id))
        self.conversations.show_new(str(conv.id), conv.title or "Untitled", time.time())
        self._made_here.add(str(conv.id))
        self._switch(conv, conv.title or "Untitled", opened=True)

    def _adopt_unassigned(self, conversation_id: str) -> None:
        """Messages written while New was pending belong to the conversation it created."""
        for queued in self.queued:
            queued.conversation_id = queued.conversation_id or conversation_id

    def _create_failed(self, previous: Any, title: str, exc: BaseException) -> None:
        self.creating = False
        unsent = [q for q in self.queued if not q.conversation_id]
        self.queued = [q for q in self.queued if q.conversation_id]
        for queued in unsent:
            self._return_draft(queued, shown_here=True)
        self._fail(exc)
        self._drop_after_switch = ""               # the conversation left stays: nothing replaced it
        if previous is not None:
            self._switch(previous, title, opened=False)

    def open_conversation(self, conversation_id: str) -> None:
        if conversation_id == self.current_id:
            return
        if self.model_info is None and self.conv is None:    # no model yet: read it from SQLite
            if conversation_id != self.viewed_id and not self.queued:
                self._view(conversation_id)
            return
        if not self._engine_or_say():
            return
        row = self.conversations.row_of(conversation_id)
        title = (self.conversations.rows[row].title if row >= 0 else "") or "Untitled"
        self._leave()
        self._switch(Conversation(self.engine, conversation_id), title, opened=False)

    def _opened(self, conv: Any) -> None:
        """A conversation the engine made or imported (a fork, an import) becomes the highlighted one."""
        self._leave()
        self._switch(conv, conv.title or "Untitled", opened=False)

    def _leave(self) -> None:
        """The highlighted conversation is about to change: an empty one is deleted once the next one shows; a
        rebuild of one with no message waiting is cancelled (the engine serves what the user looks at)."""
        conv = self.conv
        self.creating = False
        if conv is None:
            return
        conversation_id = str(conv.id)
        waiting = any(q.conversation_id == conversation_id for q in self.queued)
        if self.is_empty_conversation():
            self._drop_after_switch = conversation_id
        if conversation_id in self.opening_ids and not waiting:
            self.bridge.call(self.engine.cancel_open, conversation_id, urgent=True, on_error=self._fail)

    def is_empty_conversation(self) -> bool:
        """The highlighted conversation has no message, none waits, and no reply streams into it."""
        conversation_id = self.current_id
        known = self.history_loaded or conversation_id in self._made_here     # New made it: nothing to read back
        return bool(conversation_id) and known and not self.messages \
            and not any(q.conversation_id == conversation_id for q in self.queued) \
            and conversation_id not in self.streams

    def _switch(self, conv: Any, title: str, *, opened: bool) -> None:
        """Highlight `conv` now: its saved messages show as soon as SQLite gives them; unless `opened` (the engine
        holds it already), its KV opens in the background (restored, or rebuilt with progress and a Cancel)."""
        conversation_id = str(conv.id)
        opened = opened or conversation_id in self.streams    # its reply is being written: the engine holds it
        self.conv = conv
        self.creating = False
        self.viewed_id = ""
        self.history_loaded = False
        self.errorResolved.emit("")                # an earlier conversation's errors do not follow
        self.drop_undo()                           # nor does the undo of its delete
        kept = sorted([*self._event_log[""], *self._event_log[conversation_id]], key=lambda e: e[2])
        self.events.set_rows(kept[-EVENTS_KEPT:])
        self.blocks.set_blocks([])
        self.title = title
        self.last_open.remember(conversation_id)
        self.currentChanged.emit(conversation_id, self.title)
        self.generatingChanged.emit(self.generating)   # its own reply's state: Stop shows where a reply is written
        self.bridge.call(conv.messages, on_done=lambda rows: self._history(conv, rows), on_error=self._fail)
        if opened:
            self.openingChanged.emit("")
        else:
            self._begin_open(conversation_id)
        self.bridge.call(self.engine.focus, conversation_id, on_error=self._fail)   # its requests go first
        self.refresh_stats()
        dropped, self._drop_after_switch = self._drop_after_switch, ""
        self._made_here.discard(dropped)
        if dropped and dropped != conversation_id:
            self.bridge.call(self.engine.delete_conversation, dropped,
                             on_done=lambda _: self.refresh_conversations(), on_error=self._fail)
        else:
            self.refresh_conversations()

    def _begin_open(self, conversation_id: str) -> None:
        """Open the conversation's KV on the engine thread without waiting for it (`Engine.begin_open`)."""
        self.opening_ids.add(conversation_id)
        self.unopened_ids.discard(conversation_id)
        if conversation_id == self.current_id:
            self.openingChanged.emit(self.title)

        def settled(exc: BaseException | None) -> None:
            self._open_settled(conversation_id, exc)
        self.bridge.call(self.engine.begin_open, conversation_id,
                         on_done=lambda future: self.bridge.track(future, on_done=lambda _: settled(None),
                                                                  on_error=settled),
                         on_error=settled)

    def _open_settled(self, conversation_id: str, exc: BaseException | None) -> None:
        self.opening_ids.discard(conversation_id)
        if exc is not None:
            self.unopened_ids.add(conversation_id)
        current = conversation_id == self.current_id
        if current:
            self.openingChanged.emit("")
            self._say_if_settled()
        if exc is None:
            if current:
                self.refresh_stats()
            self._send_next_queued()
            return
        unsent = [q for q in self.queued if q.conversation_id == conversation_id]
        self.queued = [q for q in self.queued if q.conversation_id != conversation_id]
        for queued in unsent:
            self._return_draft(queued, shown_here=current)
        asked = conversation_id in self._cancel_asked
        self._cancel_asked.discard(conversation_id)
        if isinstance(exc, RebuildCancelled):
            if current and asked:                  # the user's Cancel (not a delete or a switch)
                self.warningRaised.emit(f"Rebuilding “{self.title}” from its history was cancelled. Its messages "
                                        "are shown from the saved chat; sending a message rebuilds it.")
        elif current or unsent:
            self._fail(exc)

    def cancel_rebuild(self) -> None:
        """Stop rebuilding the highlighted conversation from its history (it stays shown, read from SQLite)."""
        if self.current_id in self.opening_ids:
            self._cancel_asked.add(self.current_id)
            self.bridge.call(self.engine.cancel_open, self.current_id, urgent=True, on_error=self._fail)

    def _history(self, conv: Any, rows: list[dict[str, Any]]) -> None:
        if conv is not self.conv:
            return
        self.history_loaded = True
        self._made_here.discard(str(conv.id))
        stream = self.stream
        if stream is not None:
            rows, unstored = _rows_beside(stream, rows)
        self.messages = [ChatMessage.from_history(r, i) for i, r in enumerate(rows)
                         if r.get("role") in ("user", "assistant")]
        if stream is not None:
            self.messages += [*unstored, ChatMessage("assistant", stream.text)]
        for queued in self.queued:
            if queued.conversation_id == self.current_id:
                self.messages += [ChatMessage("user", queued.text, [(n, len(t)) for n, t in queued.attachments],
                                              created_at=queued.sent_at),
                                  ChatMessage("assistant", "", meta=self._waiting_note(self.current_id))]
        self.messagesReset.emit(list(self.messages))
        self.load_versions(conv)
        self.reveal_pending()
        if self.stream is None and any(m.role == "assistant" for m in self.messages):
            self._auto_title()                     # its reply ended while another conversation was shown
        self.refresh_stats()                       # the size of a conversation not loaded yet
        self._say_if_settled()
        self._send_next_queued()

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        title = title.strip()
        if not title:
            return
        def done(_: Any) -> None:
            if conversation_id == self.current_id:
                self.title = title
                self.titleChanged.emit(conversation_id, title)
            self.refresh_conversations()
        self.bridge.call(self.engine.rename_conversation, conversation_id, title, on_done=done,
                         on_error=self._fail)

    def pin_conversation(self, conversation_id: str, pinned: bool) -> None:
        self.bridge.call(self.engine.pin_conversation, conversation_id, pinned,
                         on_done=lambda _: self.refresh_conversations(), on_error=self._fail)

    def keep_file(self, file_name: str, keep: bool) -> None:
        """Keep an attached file of the open conversation in context until let go, or let it go (the memory panel's
        block menu); a budget too small for it says why and changes nothing."""
        if self.engine is None or not self.current_id:
            return
        self.bridge.call(self.engine.keep_file, self.current_id, file_name, keep,
                         on_done=lambda _: self.refresh_stats(), on_error=self._fail)

    def delete_conversation(self, conversation_id: str) -> None:
        was_current = conversation_id == self.current_id
        self.stop(conversation_id)
        if conversation_id in self.opening_ids:
            self.bridge.call(self.engine.cancel_open, conversation_id, urgent=True, on_error=self._fail)
        self.queued = [q for q in self.queued if q.conversation_id != conversation_id]

        def done(_: Any) -> None:
            if was_current:
                self.conv = None
                self.messages = []
                self.messagesReset.emit([])
                self.bridge.call(self.engine.conversations, on_done=self._open_latest, on_error=self._fail)
            else:
                self.refresh_conversations()
        self.bridge.call(self.engine.delete_conversation, conversation_id, on_done=done, on_error=self._fail)

    # -- attachments ------------------------------------------------------------------------
    def attach_file(self, path: str) -> bool:
        try:
            name, text = read_text_attachment(path)
        except AttachmentError as exc:
            self.errorRaised.emit(str(exc))
            return False
        self.attach_text(name, text)
        return True

    def attach_text(self, name: str, text: str) -> None:
        self.pending.append((name, text))
        self.attachmentsChanged.emit([(n, len(t)) for n, t in self.pending])

    def attach_paste(self, text: str) -> str:
        name = paste_name(text, {n for n, _ in self.pending})
        self.attach_text(name, text)
        return name

    def remove_attachment(self, index: int) -> None:
        if 0 <= index < len(self.pending):
            del self.pending[index]
            self.attachmentsChanged.emit([(n, len(t)) for n, t in self.pending])

    # -- a turn -----------------------------------------------------------------------------
    def draft_settled(self, text: str) -> None:
        """The user paused typing `text`: on idle time the engine embeds it and, for the open conversation, works
        out its input and recovery (`Engine.prepare_ahead`), so sending it waits for none of that."""
        text = text.strip()
        if not text or self.engine is None or self.model_state != "ready":
            return
        if self.current_id and not self.streams and self.current_id not in self.opening_ids:
            self.bridge.call(self.engine.prepare_ahead, self.current_id, text, list(self.pending),
                             on_error=lambda _exc: None)                     # only an optimisation
        else:
            self.bridge.call(self.engine.embed_ahead, text, on_error=lambda _exc: None)

    def draft_typed(self, text: str) -> None:
        """The user paused a moment typing `text` (`DRAFT_EMBED_MS`): its vector starts now, beside the GUI and the
        idle engine (`Engine.embed_draft`), so an Enter right after the last keystroke, before the draft settles,
        decides its recovery without waiting for it. Nothing while a reply streams (it would slow the decode: the
        settled draft is embedded after the turn instead)."""
        text = text.strip()
        if text and self.engine is not None and self.model_state == "ready" and not self.streams:
            self.bridge.call(self.engine.embed_draft, text, on_error=lambda _exc: None)   # only an optimisation

    def send(self, text: str, **options: Any) -> bool:
        """Send `text` with the pending attachments; False when nothing can be sent now (the text stays).

        Before the model is ready (or its first conversation open) the message waits in the chat and is
        sent when it is; with no model at all it says why and keeps the text.
        """
        text = text.strip()
        if not text and not self.pending:
            return False
        if self.model_state == "failed":
            self.raise_error(self._no_model_text(), "model")
            return False
        conversation_id = self.current_id or ("" if self.creating else self.viewed_id)
        if conversation_id in self.streams or any(q.conversation_id == conversation_id for q in self.queued):
            return False                           # its reply streams, or a message already waits there
        if conversation_id in self.unopened_ids and conversation_id == self.current_id:
            self._begin_open(conversation_id)        # its rebuild was cancelled: the message waits for a new one
        attachments = list(self.pending)
        self.pending = []
        self.attachmentsChanged.emit([])
        user = ChatMessage("user", text, [(n, len(t)) for n, t in attachments])
        ready = self._can_send_to(conversation_id)    # another conversation's reply streams beside it
        self.messages += [user, ChatMessage("assistant", "", meta="" if ready else self._waiting_note(conversation_id))]
        self.messageAdded.emit(user)
        self.messageAdded.emit(self.messages[-1])
        if ready:
            self._stream_reply(self.conv, self.conv.submit, text, attachments=attachments, question=user, **options)
        else:
            self.queued.append(QueuedMessage(conversation_id, text, attachments, options))
        return True

    def _can_send_to(self, conversation_id: str) -> bool:
        """The model is ready and the conversation exists, is open in the engine and (when shown) on screen."""
        if not conversation_id or conversation_id in self.opening_ids or self.model_state not in ("ready", "unloaded"):
            return False
        if conversation_id == self.current_id:
            return self.history_loaded
        return self.conv is not None and conversation_id != self.viewed_id    # a conversation left while it opened

    def _waiting_note(self, conversation_id: str) -> str:
        return REBUILD_NOTE if conversation_id and conversation_id in self.opening_ids \
            and self.model_state in ("ready", "unloaded") else WAITING_NOTE

    def _send_next_queued(self) -> None:
        """Send every waiting message that can go now (one reply at a time in each conversation)."""
        for queued in list(self.queued):
            if queued.conversation_id not in self.streams and self._can_send_to(queued.conversation_id):
                self.queued.remove(queued)
                self._send_queued(queued)

    def _send_queued(self, queued: QueuedMessage) -> None:
        """Send a message that waited (in the shown conversation its bubbles are already the last two)."""
        if queued.conversation_id == self.current_id:
            conv = self.conv
            self.messagesTruncated.emit(len(self.messages) - 1)
            self.messages[-1] = ChatMessage("assistant", "")
            self.messageAdded.emit(self.messages[-1])
        else:
            conv = Conversation(self.engine, queued.conversation_id)
        question = ChatMessage("user", queued.text, [(n, len(t)) for n, t in queued.attachments],
                               created_at=queued.sent_at)
        self._stream_reply(conv, conv.submit, queued.text, attachments=queued.attachments,
                           waited_since=queued.entered_at, question=question, **queued.options)

    def _stream_reply(self, conv: Any, start: Any, *args: Any, waited_since: float | None = None,
                      question: ChatMessage | None = None, **kwargs: Any) -> None:
        """Call `start` (a turn that returns a Future of a Reply) and stream its tokens into the last message.
        `waited_since`: when the user sent a message that waited; its first-token time counts from then."""
        now = time.perf_counter()
        conversation_id = str(conv.id)
        self.streams[conversation_id] = Stream(conversation_id, now, question=question,
                                               waited_s=now - waited_since if waited_since is not None else 0.0)
        if conversation_id == self.current_id:
            self.generatingChanged.emit(True)
        self.mark_generating()
        on_token = self.bridge.token_callback(conversation_id)

        def done(reply: Any) -> None:
            self._reply_done(conversation_id, reply)

        def failed(exc: BaseException) -> None:
            self._reply_failed(conversation_id, exc)
        self.bridge.call(start, *args, on_token=on_token, **kwargs,
                         on_done=lambda fut: self.bridge.track(fut, on_done=done, on_error=failed), on_error=failed)

    def stop(self, conversation_id: str | None = None) -> None:
        """Stop the reply being written in `conversation_id` (default: the shown conversation), only that one."""
        conversation_id = self.current_id if conversation_id is None else conversation_id
        if conversation_id in self.streams and self.engine is not None:
            self.bridge.call(self.engine.cancel, conversation_id, urgent=True, on_error=self._fail)

    def stop_all(self) -> None:
        """Stop every reply being written (the window closes)."""
        for conversation_id in list(self.streams):
            self.stop(conversation_id)

    def _on_token(self, conversation_id: str, piece: str) -> None:
        stream = self.streams.get(conversation_id)
        if stream is None:
            return
        if stream.first_at is None:
            stream.first_at = time.perf_counter()
        stream.text += piece
        stream.pieces += 1
        if not self._flush.isActive():
            self._flush.start()

    def _emit_progress(self) -> None:
        if self.stream is not None and self.history_loaded:
            if self.messages and self.messages[-1].role == "assistant":
                self.messages[-1].text = self.stream.text
            self.replyProgress.emit(self.stream.text)

    def _reply_done(self, conversation_id: str, reply: Any) -> None:
        stream = self.streams.pop(conversation_id, None)
        self.mark_generating()
        text = getattr(reply, "text", None)
        text = text if isinstance(text, str) else (stream.text if stream else str(reply))
        now = time.perf_counter()
        ttft = getattr(reply, "ttft_s", None)
        if ttft is None and stream and stream.first_at:
            ttft = stream.first_at - stream.started
        rate = getattr(reply, "tokens_per_s", None)
        if rate is None and stream and stream.first_at and now > stream.first_at:
            rate = stream.pieces / (now - stream.first_at)
        n_tokens = int(getattr(reply, "n_tokens", 0) or 0)
        stopped = str(getattr(reply, "stopped", ""))
        waited = stream.waited_s if stream is not None else 0.0
        if ttft is not None and waited > 0:
            ttft += waited                            # a message that waited counts from when it was sent
        meta = reply_meta(n_tokens, float(rate or 0.0), float(ttft or 0.0), stopped,
                          stream.pieces if stream is not None and text else 0)
        if waited >= 0.05:
            meta += f" (waited {waited:.1f} s before it was sent)"
        current = conversation_id == self.current_id
        shown = current and self.history_loaded and self.messages
        message = ChatMessage("assistant", text, stopped=stopped, meta=meta,
                              created_at=self.messages[-1].created_at if shown else time.time())
        if shown:
            self.messages[-1] = message
            self.replyFinished.emit(message)
        if current:
            self.turnMetrics.emit(float(ttft or 0.0), float(rate or 0.0))
            self._auto_title()
            self._reload_indexes(self.conv)
            self.generatingChanged.emit(False)
        self.refresh_stats()
        self.refresh_conversations()
        self._send_next_queued()

    def _auto_title(self) -> None:
        """Name an untitled conversation after its first message (the user can rename it)."""
        if self.title not in DEFAULT_TITLES:
            return
        first = next((m for m in self.messages if m.role == "user"), None)
        if first is not None and (title := title_from(first.text, first.attachments)):
            self.rename_conversation(self.current_id, title)

    def _reply_failed(self, conversation_id: str, exc: BaseException) -> None:
        stream = self.streams.pop(conversation_id, None)
        self.mark_generating()
        current = conversation_id == self.current_id
        shown = current and self.history_loaded and self.messages
        message = ChatMessage("assistant", stream.text if stream else "", stopped="error",
                              meta=f"error: {error_text(exc)}",
                              created_at=self.messages[-1].created_at if shown else time.time())
        if shown:
            self.messages[-1] = message
            self.replyFinished.emit(message)
        if current:
            self.generatingChanged.emit(False)
        self.raise_error(f"The reply failed: {error_text(exc)}")
        if current:
            self._reload_indexes(self.conv)            # a failed turn is rolled back
        self.refresh_stats()
        self._send_next_queued()

    # -- memory view ------------------------------------------------------------------------
    def budget_floor(self) -> tuple[int | None, Callable[[Any], int] | None]:
        """(the longest shared prefix: the open conversation's or a new one's, settings -> the smallest budget that
        works), None when unknown. The rule is the engine's (`min_budget_tokens`); the engine still refuses what
        slips by."""
        known = [int(n) for n in (getattr(self.stats, "prefix_tokens", None), self.floor_prefix_tokens)
                 if n is not None]
        if not known:
            return None, None
        prefix = max(known)
        return int(prefix), lambda settings: min_budget_tokens(int(prefix), settings)

    @property
    def stats_pending(self) -> bool:
        """A stats request is in flight (tests and the GUI bench wait for it to land)."""
        return self._stats_busy

    def refresh_stats(self) -> None:
        """Ask for the open conversation's stats; coalesces calls while one is in flight."""
        conv = self.conv
        if conv is None:
            return
        if self._stats_busy:
            self._stats_dirty = True
            return
        self._stats_busy = True
        self.bridge.call(conv.stats, on_done=lambda s: self._stats(conv, s), on_error=self._stats_failed)

    def _stats(self, conv: Any, stats: Any) -> None:
        self._stats_busy = False
        if conv is self.conv:
            self.stats = stats
            view = stats.as_dict()                     # widgets get plain data
            view["history_messages"] = len(self.messages)     # its size while its KV is not loaded
            view["history_chars"] = sum(len(m.text) for m in self.messages)
            self.blocks.set_blocks(view["blocks"])
            self.statsChanged.emit(view)
        if self._stats_dirty:
            self._stats_dirty = False
            self.refresh_stats()

    def _stats_failed(self, exc: BaseException) -> None:
        self._stats_busy = False
        log.warning("stats failed: %s", error_text(exc))

    def _recall_model(self, event: Any) -> None:
        """The embedder (the recall model) is warming up, ready or failed: said once per change."""
        detail = getattr(event, "detail", None) or {}
        if event.kind == EventKind.EMBEDDER_WARMING:
            state, self._recall_first_use = "warming", bool(detail.get("first_use"))
        else:
            state = "failed" if detail.get("error") else "ready"
        if (state, event.message) != self._recall_said:
            self._recall_said = (state, event.message)
            self.recallModelChanged.emit(state, self._recall_first_use, event.message)

    def _on_event(self, event: Any) -> None:
        kind = str(getattr(event, "kind", ""))          # an EventKind (a str enum): kept as its plain value
        message = getattr(event, "message", "") or kind
        conv_id = getattr(event, "conversation_id", None)
        if kind in (EventKind.EMBEDDER_WARMING, EventKind.EMBEDDER_READY):
            self._recall_model(event)
            return
        if kind == EventKind.MODEL_LOADING:
            self._set_model_state("loading", message)
        elif kind == EventKind.MODEL_LOADED and self.model_info is not None:
            self._set_model_state("ready", message)
        elif kind == EventKind.MODEL_UNLOADED and (getattr(event, "detail", None) or {}).get("reason") != "reload":
            self._set_model_state("unloaded", message)      # a reload's unload is followed by its loading
        elif kind == EventKind.PREFILL:
            if conv_id in (None, self.current_id):
                self.prefillProgress.emit(int(getattr(event, "tokens", 0)), message)
            return
        elif kind == EventKind.KV_REBUILDING:
            if conv_id == self.current_id:
                detail = getattr(event, "detail", None) or {}
                done = int(detail.get("done", getattr(event, "tokens", 0)))
                self.rebuildProgress.emit(self.title, done, max(done, int(detail.get("total", done))))
            return
        if kind not in MEMORY_EVENTS and kind not in (EventKind.MODEL_UNLOADED, EventKind.LOAD_FAILED):
            return
        block = getattr(event, "block", None)
        text = message if block is None or block in message else f"{kind} {block}"
        when = float(getattr(event, "time", 0) or time.time())
        self._event_log[conv_id or ""].append((kind, text, when))   # shown again when it is reopened
        if conv_id not in (None, self.current_id):
            return
        self.events.append(kind, text, when)
        if block and kind in STATE_OF_EVENT:
            self.blocks.set_state(block, STATE_OF_EVENT[kind])
        if kind == EventKind.ERROR:
            (self.errorRaised if conv_id is not None else self.warningRaised).emit(message)
        if conv_id is not None and not self._stats_timer.isActive():
            self._stats_timer.start()
