"""The app's state, headless: the open conversation, its messages, the streaming reply, models.

Invariants: widgets only call these methods and listen to these signals; every engine call
goes through the bridge (never on the GUI thread); one reply streams at a time.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from evoke_engine.errors import DataDirInUseError
from evoke_engine.events import EventKind
from evoke_engine.memory.memory import min_budget_tokens

from .attachments import AttachmentError, paste_name, read_text_attachment
from .bridge import EngineBridge, error_text
from .editing_flow import EditingFlow
from .last_open import LastConversation, startup_choice
from .messages import DEFAULT_TITLES, ChatMessage, Stream, model_name, reply_meta, title_from
from .models import BlockTableModel, ConversationListModel, EventLogModel
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
LIVE_STATS_MS = 500                            # stats refresh period while a reply streams


class ChatController(SettingsFlow, EditingFlow, SearchFlow, VersionsFlow, QObject):
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
        self.queued: tuple[str, list[tuple[str, str]], dict[str, Any]] | None = None   # sent once ready
        self.viewed_id = ""                        # the conversation shown read-only before any model loaded
        self.history_loaded = False                # the open conversation's messages are on screen
        self.opening: tuple[str, str] = ("", "")   # (id, title) of the conversation being opened
        self.error_topic = ""
        self.stream: Stream | None = None
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
    def generating(self) -> bool:
        return self.stream is not None

    @property
    def current_id(self) -> str:
        return str(self.conv.id) if self.conv is not None else ""

    def start(self) -> None:
        self.bridge.start()

    def _shutdown(self) -> None:
        for timer in (self._flush, self._stats_timer, self._list_timer, self._live_stats):
            timer.stop()

    def _set_model_state(self, state: str, detail: str = "") -> None:
        self.model_state = state
        self.modelStateChanged.emit(state, detail)
        if state in ("ready", "unloaded") and self.queued is not None and self.conv is not None \
                and self.history_loaded and not self.generating:
            self._send_queued()

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
        self.errorResolved.emit("model")
        self._list_timer.start()
        if first:
            self.bridge.call(self.engine.conversations, on_done=self._open_latest, on_error=self._fail)

    def _open_latest(self, infos: list[Any]) -> None:
        self.conversations.set_conversations(infos)
        if self.conv is not None:
            return
        ids = [row.id for row in self.conversations.rows]
        chosen = startup_choice(ids, self.viewed_id, self.last_open.recall())   # the last one shown, if any
        if chosen is not None:
            self.open_conversation(chosen)
        else:
            self.new_conversation()

    def _model_failed(self, message: str) -> None:
        self._set_model_state("failed", message)
        if isinstance(self.bridge.load_error, DataDirInUseError):     # no engine started: the other one owns it
            self.raise_error(f"Evoke Desk cannot start its engine: {message}. This window shows your conversations "
                             "read-only.", "model")
        else:
            self.raise_error(f"The model could not be loaded: {message}. Your conversations stay readable; "
                             "choose a working model in Settings → Model to chat.", "model")
        if self.queued is not None:                 # the waiting message goes back to the box, not lost
            text, attachments, _ = self.queued
            self.queued = None
            self.pending = attachments + self.pending
            self.attachmentsChanged.emit([(n, len(t)) for n, t in self.pending])
            self.draftReturned.emit(text)
            if self.messages[-2:] and self.messages[-1].role == "assistant" and not self.messages[-1].text:
                del self.messages[-2:]
                self.messagesTruncated.emit(len(self.messages))
        if self.model_info is None:
            self.read_history_without_model()

    def read_history_without_model(self) -> None:
        """List the conversations from SQLite (no model needed) and show the latest one, read-only."""
        from evoke_engine.conversations.history_view import read_conversations

        def listed(infos: list[Any]) -> None:
            if self.model_info is not None:
                return
            self.conversations.set_conversations(infos)
            if self.conv is None and not self.viewed_id and self.conversations.rows:
                self._view(startup_choice([r.id for r in self.conversations.rows], "", self.last_open.recall())
                           or self.conversations.rows[0].id)
        self.bridge.call(read_conversations, self.settings,
                         on_done=listed, on_error=lambda exc: self._fail_with("Could not read the history", exc))

    def _view(self, conversation_id: str) -> None:
        """Show a conversation's messages from SQLite, read-only (no model has loaded yet)."""
        from evoke_engine.conversations.history_view import read_messages

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
        if self._engine_or_say():
            self.bridge.call(self.engine.new_conversation, on_done=self._opened, on_error=self._fail)

    def open_conversation(self, conversation_id: str) -> None:
        if conversation_id == self.current_id:
            return
        if self.model_info is None and self.conv is None:    # no model yet: read it from SQLite
            if conversation_id != self.viewed_id and self.queued is None:
                self._view(conversation_id)
            return
        if not self._engine_or_say():
            return
        row = self.conversations.row_of(conversation_id)
        self.opening = (conversation_id, (self.conversations.rows[row].title if row >= 0 else "") or "Untitled")
        self.bridge.call(self.engine.open_conversation, conversation_id, on_done=self._opened,
                         on_error=self._fail)

    def _opened(self, conv: Any) -> None:
        self.conv = conv
        self.viewed_id = ""
        self.history_loaded = False
        self.errorResolved.emit("")                # an earlier conversation's errors do not follow
        self.drop_undo()                           # nor does the undo of its delete
        kept = sorted([*self._event_log[""], *self._event_log[str(conv.id)]], key=lambda e: e[2])
        self.events.set_rows(kept[-EVENTS_KEPT:])
        self.blocks.set_blocks([])
        self.title = conv.title or "Untitled"
        self.last_open.remember(str(conv.id))
        self.currentChanged.emit(str(conv.id), self.title)
        self.bridge.call(conv.messages, on_done=lambda rows: self._history(conv, rows), on_error=self._fail)
        self.bridge.call(self.engine.focus, str(conv.id), on_error=self._fail)   # its requests go first
        self.refresh_stats()
        self.refresh_conversations()

    def _history(self, conv: Any, rows: list[dict[str, Any]]) -> None:
        if conv is not self.conv:
            return
        self.history_loaded = True
        self.messages = [ChatMessage.from_history(r, i) for i, r in enumerate(rows)
                         if r.get("role") in ("user", "assistant")]
        if self.stream is not None and self.stream.conversation_id == self.current_id:
            self.messages.append(ChatMessage("assistant", self.stream.text))
        if self.queued is not None:
            text, attachments, _ = self.queued
            self.messages += [ChatMessage("user", text, [(n, len(t)) for n, t in attachments]),
                              ChatMessage("assistant", "", meta=WAITING_NOTE)]
        self.messagesReset.emit(list(self.messages))
        self.load_versions(conv)
        self.reveal_pending()
        if self.queued is not None and self.model_state in ("ready", "unloaded") and not self.generating:
            self._send_queued()

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

    def delete_conversation(self, conversation_id: str) -> None:
        was_current = conversation_id == self.current_id
        if was_current and self.generating:
            self.stop()

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
    def send(self, text: str, **options: Any) -> bool:
        """Send `text` with the pending attachments; False when nothing can be sent now (the text stays).

        Before the model is ready (or its first conversation open) the message waits in the chat and is
        sent when it is; with no model at all it says why and keeps the text.
        """
        text = text.strip()
        if (not text and not self.pending) or self.generating or self.queued is not None:
            return False
        if self.model_state == "failed":
            self.raise_error(self._no_model_text(), "model")
            return False
        attachments = list(self.pending)
        self.pending = []
        self.attachmentsChanged.emit([])
        user = ChatMessage("user", text, [(n, len(t)) for n, t in attachments])
        ready = self.conv is not None and self.history_loaded and self.model_state in ("ready", "unloaded")
        self.messages += [user, ChatMessage("assistant", "", meta="" if ready else WAITING_NOTE)]
        self.messageAdded.emit(user)
        self.messageAdded.emit(self.messages[-1])
        if ready:
            self._stream_reply(self.conv, self.conv.submit, text, attachments=attachments, **options)
        else:
            self.queued = (text, attachments, options)
        return True

    def _send_queued(self) -> None:
        """Send the message that waited for the model (its bubbles are already the last two)."""
        assert self.queued is not None and self.conv is not None
        (text, attachments, options), self.queued = self.queued, None
        self.messagesTruncated.emit(len(self.messages) - 1)
        self.messages[-1] = ChatMessage("assistant", "")
        self.messageAdded.emit(self.messages[-1])
        self._stream_reply(self.conv, self.conv.submit, text, attachments=attachments, **options)

    def _stream_reply(self, conv: Any, start: Any, *args: Any, **kwargs: Any) -> None:
        """Call `start` (a turn that returns a Future of a Reply) and stream its tokens into the last message."""
        self.stream = Stream(str(conv.id), time.perf_counter())
        self.generatingChanged.emit(True)
        on_token = self.bridge.token_callback(str(conv.id))
        self.bridge.call(start, *args, on_token=on_token, **kwargs,
                         on_done=lambda fut: self.bridge.track(fut, on_done=self._reply_done,
                                                               on_error=self._reply_failed),
                         on_error=self._reply_failed)

    def stop(self) -> None:
        if self.stream is not None and self.conv is not None:
            self.bridge.call(self.conv.cancel, urgent=True, on_error=self._fail)

    def _on_token(self, conversation_id: str, piece: str) -> None:
        stream = self.stream
        if stream is None or stream.conversation_id != conversation_id:
            return
        if stream.first_at is None:
            stream.first_at = time.perf_counter()
        stream.text += piece
        stream.pieces += 1
        if not self._flush.isActive():
            self._flush.start()

    def _emit_progress(self) -> None:
        if self.stream is not None and self.stream.conversation_id == self.current_id:
            if self.messages and self.messages[-1].role == "assistant":
                self.messages[-1].text = self.stream.text
            self.replyProgress.emit(self.stream.text)

    def _reply_done(self, reply: Any) -> None:
        stream, self.stream = self.stream, None
        self._flush.stop()
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
        meta = reply_meta(n_tokens, float(rate or 0.0), float(ttft or 0.0), stopped,
                          stream.pieces if stream is not None and text else 0)
        message = ChatMessage("assistant", text, stopped=stopped, meta=meta)
        if stream is not None and stream.conversation_id == self.current_id and self.messages:
            self.messages[-1] = message
            self.replyFinished.emit(message)
        self.turnMetrics.emit(float(ttft or 0.0), float(rate or 0.0))
        if stream is not None and stream.conversation_id == self.current_id:
            self._auto_title()
            self._reload_indexes(self.conv)
        self.generatingChanged.emit(False)
        self.refresh_stats()
        self.refresh_conversations()

    def _auto_title(self) -> None:
        """Name an untitled conversation after its first message (the user can rename it)."""
        if self.title not in DEFAULT_TITLES:
            return
        first = next((m for m in self.messages if m.role == "user"), None)
        if first is not None and (title := title_from(first.text, first.attachments)):
            self.rename_conversation(self.current_id, title)

    def _reply_failed(self, exc: BaseException) -> None:
        stream, self.stream = self.stream, None
        self._flush.stop()
        message = ChatMessage("assistant", stream.text if stream else "", stopped="error",
                              meta=f"error: {error_text(exc)}")
        if stream is not None and stream.conversation_id == self.current_id and self.messages:
            self.messages[-1] = message
            self.replyFinished.emit(message)
        self.generatingChanged.emit(False)
        self.raise_error(f"The reply failed: {error_text(exc)}")
        if stream is not None and stream.conversation_id == self.current_id:
            self._reload_indexes(self.conv)            # a failed turn is rolled back
        self.refresh_stats()

    # -- memory view ------------------------------------------------------------------------
    def budget_floor(self) -> tuple[int | None, Callable[[Any], int] | None]:
        """(shared prefix tokens of the open conversation, settings -> the smallest budget that works), None
        when unknown. The rule is the engine's (`min_budget_tokens`); the engine still refuses what slips by."""
        prefix = getattr(self.stats, "prefix_tokens", None)
        if prefix is None:
            return None, None
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
            self.blocks.set_blocks(view["blocks"])
            self.statsChanged.emit(view)
        if self._stats_dirty:
            self._stats_dirty = False
            self.refresh_stats()

    def _stats_failed(self, exc: BaseException) -> None:
        self._stats_busy = False
        log.warning("stats failed: %s", error_text(exc))

    def _on_event(self, event: Any) -> None:
        kind = str(getattr(event, "kind", ""))          # an EventKind (a str enum): kept as its plain value
        message = getattr(event, "message", "") or kind
        conv_id = getattr(event, "conversation_id", None)
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
            opening_id, opening_title = self.opening
            if conv_id == self.current_id or conv_id == opening_id:
                detail = getattr(event, "detail", None) or {}
                done = int(detail.get("done", getattr(event, "tokens", 0)))
                title = self.title if conv_id == self.current_id else opening_title
                self.rebuildProgress.emit(title, done, max(done, int(detail.get("total", done))))
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
