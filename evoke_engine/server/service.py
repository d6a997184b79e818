"""Requests to engine turns: pick the conversation (a session the client owns, else the longest shared
prefix), continue, fork or create it, submit only the new tail, and report usage with the `evoke` figures.

Invariants: one request per conversation at a time (a per-conversation lock held until its turn ends,
cancelled or not); the plan is re-checked under that lock against the conversation's stored messages;
a conversation whose system prompt or tools differ from the request's is never continued; a request reaches
another client's conversation only by re-sending its history (a name or an id alone never does); sizes are
checked by counting tokens on the calling worker thread, never on the engine thread, and what one request has
decoded before its reply (its message, or an imported history as a whole) is at most a conversation's context
length less the reply's room; an imported history is rebuilt at NORMAL priority and its rebuild stops when its
client leaves (the conversation deleted). A session's KV file is rewritten on idle time after a turn, at most every
`PERSIST_EVERY_S`, so a kill -9 costs a restart only the turns since. A stateless request (no
X-Evoke-Session) that makes a conversation marks it `stateless`; one that fails or is cancelled before its first
token leaves nothing behind (the conversation it made is deleted, the turn it added to one is taken back), and a
stateless conversation idle past its KV file's TTL is deleted (`expire_stateless`). A conversation a request makes
stores its owner (the `owner` setting: the client's, as routing knows it) from its creation, so chunk reuse never
splices another client's K/V into it (`chunk_reuse_across_owners`, off), nor reports them in `usage`, and its shared
system-prompt prefix is its owner's or a public prewarmed one (another client's same prompt is decoded again: a
guessed system prompt is not confirmed by the time it takes, nor by `cached_tokens`). The API conversations kept live
(in a slot or host RAM) are at most `max_live_per_owner` of one owner and `max_live` in all: past them, once a turn has
ended, the least recently used with no request running are saved to their KV files and released (`Engine.release_soon`,
a job about that conversation: never in the middle of its reply), so one-shot requests never grow RAM; a released one
is reopened from its file when its session names it, or when its client re-sends its history (the last
`REPLAYABLE_RELEASED` released stay routable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from anyio import to_thread

from .. import (
    FORMAT_NAME,
    FORMAT_VERSION,
    NORMAL,
    REUSE_OWNER,
    Conversation,
    Engine,
    VocabCounter,
    default_system_prompt,
    system_message,
)
from ..errors import BudgetError, EvokeError, RebuildCancelled
from ..events import EventKind
from ..stats import ConversationStats
from .api_errors import ApiError, context_tokens, reply_room
from .clients import ANONYMOUS_OWNER, Client
from .constraints import forces_call
from .request_bodies import ChatRequest, check_logit_bias
from .sessions import (
    CONVERSATION_ID,
    Msg,
    Plan,
    SessionMap,
    agreement,
    canonicalize,
    check_tail,
    conversation_messages,
    plan,
)
from .toolcall_formats import HERMES, ToolCallFormat, loaded_format
from .toolcall_stream import CallReader
from .toolcalls import ParsedCall, RawTextMap, read_reply

log = logging.getLogger(__name__)
MIN_SHARED_TOKENS = 64
MODEL_ALIASES = ("evoke", "evoke-desk")
STATELESS = "stateless"              # the conversation's settings key marking a stateless API conversation
EXPIRY_CHECK_S = 60.0                # how often requests look for expired stateless conversations
GONE_POLL_S = 0.25                   # how often an import's rebuild checks that its client is still there
TEMPLATE_TOKENS = 5                  # the chat template's tokens around each message (an estimate)
PERSIST_EVERY_S = 30.0               # an API conversation's KV file is rewritten after a turn at most this often
MAX_LIVE_PER_OWNER = 4               # API conversations one owner keeps live (slot or RAM); past it they are released
MAX_LIVE = 16                        # live API conversations in all
REPLAYABLE_RELEASED = 256            # released API conversations a re-sent history may still continue


class ClientGone(ApiError):
    """The client left while its request was being prepared (an import's rebuild was cancelled)."""

    def __init__(self) -> None:
        super().__init__(499, "the client closed the request before its history was rebuilt", "client_closed")


@dataclass
class Opening:
    """An import being rebuilt for a request, cancellable from the event loop when its client leaves."""
    engine: Engine
    conversation_id: str | None = None     # set (worker thread) once the imported conversation exists
    gone: bool = False                     # set (event loop) when the client left

    def leave(self) -> None:
        self.gone = True
        if self.conversation_id is not None:
            self.engine.cancel_open(self.conversation_id)


@dataclass
class Prepared:
    conv: Conversation
    route: str                       # continue | fork | new | import
    session: str | None
    client: Client
    message: Msg
    sampling: dict
    before: ConversationStats
    tool_names: set[str]
    lock: asyncio.Lock
    future: Future | None = None
    extras: dict = field(default_factory=dict)
    messages_before: int = 0         # the conversation's messages before this turn
    tokens_seen: bool = False        # the reply's first token has come
    arrived: float = 0.0             # time.monotonic() when the request arrived (`prepare` began)
    call_format: ToolCallFormat = HERMES     # the loaded model's tool-call markup (read from its chat template)
    call_forced: bool = False        # tool_choice forces a call: the whole reply is one, cut or not
    first_token_at: float | None = None   # time.monotonic() when the reply's first piece came
    opened_tokens: int = 0           # tokens decoded for this request before its turn (a new prefix, a rebuild)
    acknowledged: bool = False       # its message was stored and the 200 said so (a failure keeps it)
    owner: str = ""                  # whose the conversation is (as `sessions` records it)

    @property
    def made_here(self) -> bool:
        """The conversation was made by this request (a new, forked or imported one)."""
        return self.route != "continue"


@dataclass
class Outcome:
    content: str | None
    tool_calls: list[dict]
    finish_reason: str
    usage: dict


def _tools_key(tools: list[dict]) -> str:
    return json.dumps(tools or [], sort_keys=True)


class ChatService:
    def __init__(self, engine: Engine, state_dir: Path, *, max_prefill_tokens: int = 0) -> None:
        self.engine = engine
        self.max_prefill_tokens = max_prefill_tokens        # 0: the whole context less the reply's room
        self.raw_map = RawTextMap()
        self.sessions = SessionMap(state_dir / "api_sessions.json", self.raw_map)
        self.sessions.prune(lambda cid: engine.history.get_conversation(cid) is not None)
        self._locks: dict[str, asyncio.Lock] = {}
        self._views: dict[str, tuple[float, str, str, list[Msg]]] = {}
        self._counter: VocabCounter | None = None
        self._counter_lock = threading.Lock()
        self._in_flight: dict[int, Conversation] = {}      # id(Prepared) -> its conversation, while its turn runs
        self._flight_lock = threading.Lock()
        self._expiry_checked = 0.0                   # the first request looks for expired stateless conversations
        self._cleanups: set[asyncio.Task] = set()    # `abandon` tasks running (held: the loop keeps weak references)
        self._persisted: dict[str, float] = {}        # conversation id -> when its KV file was last asked for
        self._rebuilt: dict[str, tuple[float, int]] = {}   # conversation id -> (when, tokens) of its last rebuild
        self.max_live_per_owner, self.max_live = MAX_LIVE_PER_OWNER, MAX_LIVE
        self._live: OrderedDict[str, str] = OrderedDict()       # live API conversation -> owner, least recent first
        self._released: OrderedDict[str, str] = OrderedDict()   # released by the caps -> owner (replay may continue)
        engine.subscribe(self._on_event)

    def cancel_all(self) -> None:
        """Stop every generation in flight (shutdown): partial replies are kept, streams end with [DONE]."""
        with self._flight_lock:
            conversations = list(self._in_flight.values())
        for conv in conversations:
            conv.cancel()

    def expire_stateless(self, now: float | None = None) -> list[str]:
        """Delete the stateless API conversations (not pinned, no request running) idle past their KV file's TTL;
        their ids."""
        now = time.time() if now is None else now
        self._expiry_checked = now
        ttl = self.engine.settings.ttl_seconds()["long"]           # the TTL class of an unpinned conversation
        expired = []
        for row in self.engine.history.list_conversations():
            settings = row.settings if isinstance(row.settings, dict) else {}
            lock = self._locks.get(row.id)
            if (settings.get(STATELESS) and not row.pinned and row.updated_at + ttl < now
                    and not (lock is not None and lock.locked())):
                self.engine.delete_conversation(row.id)
                expired.append(row.id)
        if expired:
            self.sessions.prune(lambda cid: self.engine.history.get_conversation(cid) is not None)
            log.info("endpoint: %d stateless API conversation(s) expired", len(expired))
        return expired

    def close(self) -> None:
        self.engine.unsubscribe(self._on_event)
        with self._counter_lock:
            if self._counter is not None:
                self._counter.close()
                self._counter = None

    def vocabulary(self) -> VocabCounter:
        """The model's vocabulary for the calling thread (vocabulary-only, reloaded on a model change)."""
        path = Path(self.engine.model_info().path)
        with self._counter_lock:
            if self._counter is None or self._counter.model_path != path:
                if self._counter is not None:
                    self._counter.close()
                self._counter = self.engine.backend.vocabulary(path)     # llama.cpp's, or a simulated one
            return self._counter

    def check_logit_bias(self, bias: dict[int, float]) -> None:
        """400 for a `logit_bias` token id outside the model's vocabulary (worker thread)."""
        check_logit_bias(bias, self.vocabulary().n_tokens)

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` counted on the calling thread."""
        return self.vocabulary().count(text)

    # -- model ------------------------------------------------------------------------------------
    def model_id(self) -> str:
        return Path(self.engine.model_info().path).name.removesuffix(".gguf")

    def check_model(self, name: str | None) -> str:
        model_id = self.model_id()
        if name and name not in (model_id, f"{model_id}.gguf", *MODEL_ALIASES):
            raise ApiError(404, f"model {name!r} does not exist; this server has {model_id!r} "
                                f"(also called {' or '.join(MODEL_ALIASES)})", "model_not_found", "model")
        return model_id

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    # -- routing (worker threads: SQLite and the engine thread) -------------------------------------
    def _view(self, conversation_id: str, updated_at: float | None = None) -> tuple[str, str, list[Msg]] | None:
        cached = self._views.get(conversation_id)
        if cached is not None and updated_at is not None and cached[0] == updated_at:
            return cached[1:]
        row = self.engine.history.get_conversation(conversation_id)
        if row is None:
            return None
        tools = row.settings.get("tools", []) if isinstance(row.settings, dict) else []
        view = (row.system_prompt, _tools_key(tools),
                conversation_messages(Conversation(self.engine, conversation_id).messages()))
        self._views[conversation_id] = (row.updated_at, *view)
        return view

    def _shared_tokens(self, conversation_id: str, messages: list[Msg]) -> int:
        shared = Conversation(self.engine, conversation_id).stats().prefix_tokens
        for message in messages:
            if shared >= MIN_SHARED_TOKENS:
                break
            shared += self.count_tokens(message.content)
        return shared

    @staticmethod
    def _routing_owner(client: Client) -> str:
        """Whose conversations a request without a session may continue by re-sending their history: its client
        token's (or the API key's); requests with neither share one anonymous owner (they have no identity to
        keep apart: a client that wants isolation sends `X-Evoke-Client`)."""
        return ANONYMOUS_OWNER if client.issued else client.owner

    def _route(self, owner: str, system: str, tools_key: str, messages: list[Msg]) -> str | None:
        """The open conversation of `owner` (or one the live caps released lately) sharing the longest prefix (>= 64
        tokens, >= 1 message) with the request: another client's history re-sent word for word never reaches that
        client's conversation, and two clients with identical histories keep two conversations (the window's own are
        never routed into)."""
        best, best_k = None, 0
        for info in self.engine.conversations():
            if (info.memory not in ("slot", "ram") and info.id not in self._released) \
                    or self.sessions.owner_of(info.id) != owner:
                continue
            view = self._view(info.id, info.updated_at)
            if view is None or view[0] != system or view[1] != tools_key:
                continue
            k = agreement(view[2], messages)
            full = k == len(view[2])
            if k > best_k or (k == best_k and k and full and best is not None and not best[1]):
                best, best_k = (info.id, full), k
        if best is None or self._shared_tokens(best[0], messages[:best_k]) < MIN_SHARED_TOKENS:
            return None
        return best[0]

    def _target(self, client: Client, session: str | None, system: str, tools_key: str,
                messages: list[Msg]) -> str | None:
        """The conversation a request continues: its client's named session, a conversation it may name by
        id, else the open conversation whose history it re-sends (`_route`)."""
        if session is not None:
            known = self.sessions.get(client.owner, session)
            if known is not None and self.engine.history.get_conversation(known) is not None:
                return known
            if CONVERSATION_ID.match(session) and self._may_name(client, session):
                return session
            return None
        return self._route(self._routing_owner(client), system, tools_key, messages)

    def _may_name(self, client: Client, conversation_id: str) -> bool:
        """A window conversation may be continued by its id; an API conversation only by the client that owns it."""
        row = self.engine.history.get_conversation(conversation_id)
        if row is None:
            return False
        source = row.settings.get("source") if isinstance(row.settings, dict) else None
        if source != "api":
            return True
        return self.sessions.owner_of(conversation_id) == client.owner

    # -- one request ------------------------------------------------------------------------------
    async def prepare(self, request: ChatRequest, session: str | None, client: Client,
                      disconnected: Callable[[], Awaitable[bool]] | None = None) -> Prepared:
        """The conversation and the turn of one request; `disconnected` (the request's `is_disconnected`) lets a
        client that leaves cancel the rebuild of an imported history, as it cancels a turn's prefill."""
        arrived = time.monotonic()
        canonical = canonicalize(request, self.raw_map)
        if not canonical.messages:
            raise ApiError(400, "messages holds no user or tool message", "invalid_messages", "messages")
        settings = self.engine.settings
        system = canonical.system if canonical.system is not None else (
            settings.system_prompt if settings.system_prompt is not None else default_system_prompt())
        tools = request.tool_dicts()
        tools_key = _tools_key(tools)
        if session is not None:
            session = SessionMap.valid(session)
        if time.time() - self._expiry_checked > EXPIRY_CHECK_S:
            await to_thread.run_sync(self.expire_stateless)
        await to_thread.run_sync(self._check_sizes, system, tools, canonical.messages[-1], request.asked_max_tokens)
        if request.logit_bias:
            await to_thread.run_sync(self.check_logit_bias, request.logit_bias)
        target = await to_thread.run_sync(self._target, client, session, system, tools_key, canonical.messages)
        key = target or f"new:{id(request)}"
        lock = self._lock(key)
        await lock.acquire()
        opening = Opening(self.engine)
        watcher = asyncio.create_task(self._watch(disconnected, opening)) if disconnected is not None else None
        try:
            prepared = await to_thread.run_sync(self._open, request, client, session, target, system, tools,
                                                tools_key, canonical.messages, lock, opening)
            prepared.arrived = arrived
            prepared.opened_tokens = self._opened_tokens(prepared, arrived)
        except BaseException:
            lock.release()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
            if key.startswith("new:"):
                self._locks.pop(key, None)
        self._locks.setdefault(prepared.conv.id, lock)     # the lock held now guards a new or forked conversation
        return prepared

    @staticmethod
    async def _watch(disconnected: Callable[[], Awaitable[bool]], opening: Opening) -> None:
        while not await disconnected():
            await asyncio.sleep(GONE_POLL_S)
        opening.leave()

    def _open(self, request: ChatRequest, client: Client, session: str | None, target: str | None, system: str,
              tools: list[dict], tools_key: str, messages: list[Msg], lock: asyncio.Lock,
              opening: Opening | None = None) -> Prepared:
        view = self._view(target) if target else None
        if view is None or view[0] != system or view[1] != tools_key:
            route = Plan("new", 0, messages)
        else:
            route = plan(view[2], messages)
            if (route.action != "continue" and session is not None and view[2]
                    and not any(m.role == "assistant" for m in messages) and agreement(view[2], messages) == 0):
                route = Plan("continue", len(view[2]), messages)   # stateful client: only the new message(s)
        message = check_tail(route.tail)
        if len(route.tail) > 1:          # assistant messages the engine did not write: rebuild from the text
            route = Plan("import", 0, messages)
            self._check_history(messages)
        title = (message.text.strip().splitlines() or ["API conversation"])[0][:60]
        owner = client.owner if session is not None else self._routing_owner(client)
        try:
            if route.action == "continue":
                conv = self.engine.open_conversation(target)
            elif route.action == "fork":
                conv = self.engine.fork(target, route.keep - 1)
            elif route.action == "import":
                conv = self._import(system, tools, title, messages[:-1], opening or Opening(self.engine), owner)
            else:
                conv = self.engine.new_conversation(system_prompt=system, tools=tools, title=title, source="api",
                                                    owner=owner)
            if route.action != "continue":      # its owner before its first turn: chunk reuse stays within it
                self._mark(conv.id, source="api", **{REUSE_OWNER: owner},
                           **({STATELESS: True} if session is None else {}))
        except BudgetError as exc:                      # a prefix that leaves the budget no room for a reply
            raise ApiError(400, f"{exc} (the budget_tokens setting)", "context_length_exceeded", "messages") from exc
        except EvokeError as exc:
            raise ApiError(500, f"the engine could not open the conversation: {exc}", "engine_error") from exc
        if session is not None or route.action != "continue":
            self.sessions.set(owner, session, conv.id)
        if request.evoke_task_boundary:
            conv.reset_focus()
        call_format = loaded_format(self.engine)
        self.raw_map.fmt = call_format              # a client's copy of a call is rendered back in the model's markup
        return Prepared(conv=conv, route=route.action, session=session, client=client, message=message, owner=owner,
                        call_format=call_format,
                        sampling=request.sampling(min(self.engine.settings.max_tokens, 4096)),
                        before=conv.stats(), lock=lock,
                        messages_before=len(conv.messages()) if route.action == "continue" else 0,
                        tool_names={t["function"]["name"] for t in tools} if request.parse_tools else set(),
                        call_forced=forces_call(request),
                        extras={"priority": request.evoke_priority, "pinned": request.evoke_pinned,
                                "keep": [(i, m.keep) for i, m in enumerate(messages) if m.keep],
                                "roles": [m.role for m in messages]})

    def _opened_tokens(self, prepared: Prepared, arrived: float) -> int:
        """Tokens decoded for this request before its turn: the shared prefix when it was decoded after the request
        arrived (a system prompt or tools new to this owner: prefixes are shared within an owner, or public when
        prewarmed), and a rebuild from history that opening it needed (an import's rebuild is counted by `_usage`)."""
        decoded_at = self.engine.prefix_decoded_at(prepared.conv.id)
        fresh_prefix = prepared.before.prefix_tokens if decoded_at is not None and decoded_at >= arrived else 0
        rebuilt_at, rebuilt = self._rebuilt.get(prepared.conv.id, (0.0, 0))
        return fresh_prefix + (rebuilt if rebuilt_at >= arrived and prepared.route != "import" else 0)

    def _on_event(self, event) -> None:
        """An engine event (engine thread): a finished rebuild from history is remembered for `_opened_tokens`."""
        detail = event.detail or {}
        if (event.kind == EventKind.KV_REBUILDING and event.conversation_id and not detail.get("cancelled")
                and detail.get("done") == detail.get("total")):
            if len(self._rebuilt) > 256:
                self._rebuilt.clear()           # entries older than a request in flight say nothing
            self._rebuilt[event.conversation_id] = (time.monotonic(), int(event.tokens))

    def _import(self, system: str, tools: list[dict], title: str, history: list[Msg],
                opening: Opening, owner: str) -> Conversation:
        """A new conversation holding a client-written history, its KV built from the text (a prefill queued
        behind the turns already waiting, and cancelled between two blocks when the client leaves: the
        conversation is then deleted and `ClientGone` raised). Nothing is left behind when the rebuild fails."""
        conv = self.engine.import_conversation({
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "title": title, "system_prompt": system,
            "tools": tools, "messages": [{"role": m.role, "text": m.text, "extra": m.extra,
                                          "attachments": [{"name": n, "text": t} for n, t in m.attachments]}
                                         for m in history]})
        opening.conversation_id = conv.id
        try:
            self._mark(conv.id, source="api", **{REUSE_OWNER: owner})     # before its rebuild reuses chunks
            if opening.gone:
                raise ClientGone()
            rebuilt = self.engine.begin_open(conv.id, priority=NORMAL)
            if opening.gone:                     # left between the check and the open's cancel event
                self.engine.cancel_open(conv.id)
            try:
                return rebuilt.result()
            except RebuildCancelled as exc:
                raise ClientGone() from exc
        except BaseException:
            self.engine.delete_conversation(conv.id)
            self._views.pop(conv.id, None)
            raise

    def _mark(self, conversation_id: str, **values) -> None:
        """Add `values` to the conversation's stored settings (its source, the stateless mark)."""
        row = self.engine.history.get_conversation(conversation_id)
        current = row.settings if row is not None and isinstance(row.settings, dict) else {}
        self.engine.history.set_settings(conversation_id, {**current, **values})
        self._views.pop(conversation_id, None)

    def prefill_limit(self) -> int:
        """The most tokens one request may have decoded before its reply, one message or an imported history as
        a whole: a conversation's context (`context_tokens`, the number /v1/models advertises) less the room kept
        for the reply, or `max_prefill_tokens` where lower (`serve --max-prefill-tokens`). It bounds how long one
        request holds the engine thread (a prefill is one job there; a client that leaves cancels it)."""
        whole = context_tokens(self.engine.settings) - reply_room(self.engine.settings)
        return min(whole, self.max_prefill_tokens) if self.max_prefill_tokens > 0 else whole

    def _limit_words(self) -> str:
        """How `prefill_limit` came about, for the errors that name it."""
        settings = self.engine.settings
        if self.max_prefill_tokens > 0 and self.prefill_limit() == self.max_prefill_tokens:
            return "this server's --max-prefill-tokens"
        return (f"the context of {context_tokens(settings)} tokens less {reply_room(settings)} kept for the "
                "reply")

    def _check_history(self, messages: list[Msg]) -> None:
        """400 when a history the engine did not write (the import route) is more tokens than one request may
        have decoded (`prefill_limit`), counted as a whole here, on a worker thread."""
        limit = self.prefill_limit()
        tokens = sum(TEMPLATE_TOKENS + len(m.content.encode()) for m in messages)   # a token is at least a byte
        if tokens > limit:
            tokens = sum(TEMPLATE_TOKENS + self.count_tokens(m.content) for m in messages)
        if tokens > limit:
            raise ApiError(400, f"the messages are about {tokens} tokens, {tokens - limit} over the {limit} that one "
                                f"request may have decoded ({self._limit_words()}): this history was not written "
                                "by this server (its assistant messages differ), so it is rebuilt whole; send it "
                                "with fewer or shorter messages", "context_length_exceeded", "messages")

    def _check_sizes(self, system: str, tools: list[dict], message: Msg, max_tokens: int | None = None) -> None:
        """400 before any decoding when the prefix (system prompt + tools) or the new message cannot fit in a
        conversation's context (`context_tokens`), or they and an asked `max_tokens` together cannot, saying by how
        much (counted here, on a worker thread)."""
        settings = self.engine.settings
        room, reserve = context_tokens(settings), reply_room(settings)
        prefix = self.count_tokens(system_message(system, tools)["content"])
        if prefix + reserve > room:
            raise ApiError(400, f"the system prompt and tools are {prefix} tokens; a conversation's context holds "
                                f"{room} tokens and keeps {reserve} for the messages, so they are "
                                f"{prefix + reserve - room} tokens over (shorten them, or raise n_ctx)",
                           "context_length_exceeded", "messages")
        limit = self.prefill_limit()                    # what one request may have decoded (the engine's hold)
        size = len(message.content.encode())            # a token is at least one byte: an upper bound
        if size <= limit and prefix + size + (max_tokens or 0) <= room:
            return
        tokens = self.count_tokens(message.content)
        if tokens > limit:
            raise ApiError(400, f"the new message is {tokens} tokens, {tokens - limit} over the {limit} that fit "
                                f"in one message ({self._limit_words()})", "context_length_exceeded", "messages")
        if max_tokens and prefix + tokens + max_tokens > room:
            raise ApiError(400, f"you requested {prefix + tokens + max_tokens} tokens ({prefix} in the system prompt "
                                f"and tools, {tokens} in the new message, {max_tokens} in the completion), "
                                f"{prefix + tokens + max_tokens - room} over; lower max_tokens to at most "
                                f"{max(0, room - prefix - tokens)}", "context_length_exceeded", "max_tokens")

    def submit(self, prepared: Prepared, on_token=None, on_stored: Callable[[], None] | None = None) -> Future:
        """Start the request's turn; `on_stored` (engine thread) hears that its message is in SQLite, after which
        a failure keeps the message (a streamed request's 200 waits for it: the headers acknowledge it)."""
        message = prepared.message
        kwargs = dict(prepared.sampling)
        if on_stored is not None:
            kwargs["on_stored"] = on_stored
        if message.role == "tool":
            kwargs.update(role="tool", extra=message.extra or None)

        def token(piece, *rest) -> None:
            if prepared.first_token_at is None:
                prepared.first_token_at = time.monotonic()
            prepared.tokens_seen = True
            if on_token is not None:
                on_token(piece, *rest)

        key = id(prepared)
        with self._flight_lock:
            self._in_flight[key] = prepared.conv
        prepared.future = prepared.conv.submit(message.text, message.attachments, on_token=token, **kwargs)
        # never the owner in the log: it may be derived from the API key
        log.debug("endpoint: a %s request is %s", prepared.route, prepared.future.job.describe())

        def landed(_) -> None:
            self._views.pop(prepared.conv.id, None)
            with self._flight_lock:
                self._in_flight.pop(key, None)
        prepared.future.add_done_callback(landed)
        return prepared.future

    @staticmethod
    def came_to_nothing(prepared: Prepared) -> bool:
        """A stateless request whose turn ended (or never began) before its first token: failed or cancelled."""
        if prepared.session is not None or prepared.tokens_seen:
            return False
        future = prepared.future
        if future is None or future.cancelled():
            return True
        if future.exception() is not None:
            return not prepared.acknowledged      # a failure after the 200 keeps the message it acknowledged
        reply = future.result()
        return reply.stopped == "cancelled" and int(reply.n_tokens) == 0

    def abandon(self, prepared: Prepared) -> None:
        """Leave nothing of a stateless request that came to nothing: delete the conversation it made, or take
        back the turn it added to one (worker thread, after the turn ended)."""
        conv_id = prepared.conv.id
        try:
            if prepared.made_here:
                self.engine.delete_conversation(conv_id)
                self.sessions.prune(lambda cid: cid != conv_id)
            elif len(prepared.conv.messages()) > prepared.messages_before:
                self.engine.truncate(conv_id, prepared.messages_before)
        except (EvokeError, KeyError) as exc:
            log.warning("endpoint: could not remove what a failed request left in %s: %s", conv_id, exc)
        self._views.pop(conv_id, None)

    def finish(self, prepared: Prepared, reply, streamed: CallReader | None = None) -> Outcome:
        """Tool calls, raw-text map, `evoke_*` marks and usage, once the reply is done (worker thread); `streamed`:
        the reader that streamed the reply, whose calls and ids the client has already been sent."""
        reader = streamed or read_reply(reply.text, prepared.tool_names, prepared.call_format,
                                        forced=prepared.call_forced)
        reader.close()
        finished = reader.finished_calls() if prepared.tool_names else []
        calls = [ParsedCall(c.name, c.arguments) for c in finished]
        ids = [c.call_id for c in finished]
        content = reader.content if prepared.tool_names else reply.text
        if calls:
            self.raw_map.remember(reply.text, content, calls, ids)
            self.sessions.save()
        self._apply_marks(prepared)
        if prepared.session is not None:         # a stateless conversation is never continued after a restart
            self._persist_if_due(prepared.conv.id)
        after = prepared.conv.stats()
        unfinished = bool(prepared.tool_names) and reader.unfinished
        finish = finish_reason(reply.stopped, bool(calls), unfinished)
        return Outcome(content=content, tool_calls=[c.as_openai(i) for c, i in zip(calls, ids, strict=True)],
                       finish_reason=finish, usage=self._usage(prepared, reply, after))

    def _persist_if_due(self, conversation_id: str) -> None:
        """Ask for the conversation's KV file on the engine's idle time, at most every `PERSIST_EVERY_S`: after a
        kill -9 the restart restores it and replays only the turns since, where it would otherwise rebuild the
        whole history from SQLite inside the next request's `prepare` (about 20 ms a token at the smallest budget:
        a conversation of a few thousand tokens outlasted a client's timeout, issue 42's `A.kill05.eviction`)."""
        now = time.monotonic()
        if now - self._persisted.get(conversation_id, -PERSIST_EVERY_S) >= PERSIST_EVERY_S:
            if len(self._persisted) > 256:       # entries past the interval say nothing: the map stays small
                self._persisted = {k: t for k, t in self._persisted.items() if now - t < PERSIST_EVERY_S}
            self._persisted[conversation_id] = now
            self.engine.persist_soon(conversation_id)

    def _apply_marks(self, prepared: Prepared) -> None:
        extras = prepared.extras
        if not (extras["priority"] is not None or extras["pinned"] or extras["keep"]):
            return
        stats = prepared.conv.stats()
        turn = stats.turn
        blocks = [b for b in stats.blocks if b.get("state") != "dropped"]
        wanted: dict[str, tuple[bool, float | None]] = {}
        for block in blocks:
            if block["turn"] == turn and block["role"] in ("user", "file", "tool"):
                wanted[block["name"]] = (bool(extras["pinned"]), extras["priority"])
        for index, keep in extras["keep"]:
            roles = extras["roles"]
            msg_turn = turn - sum(1 for role in roles[index + 1:] if role != "assistant")
            for block in blocks:
                if block["turn"] == msg_turn and block["role"] != "breadcrumb" and not block.get("shared"):
                    wanted[block["name"]] = (keep == "pin", 2.0 if keep == "prefer" else None)
        for name, (pinned, priority) in wanted.items():
            try:
                prepared.conv.pin_block(name, pinned, priority)
            except KeyError:
                continue

    @staticmethod
    def _usage(prepared: Prepared, reply, after: ConversationStats) -> dict:
        """OpenAI's usage and the `evoke` figures: every prompt token is `prompt_tokens` = `cached` (held in the KV
        before this request: a warm prefix, earlier turns, restored blocks) + `decoded` (for this request: its
        message, a prefix or history decoded to open the conversation) + `reused` (spliced from another
        conversation's K/V); `ttft_ms` counts from the request's arrival, `engine_ttft_ms` from its turn's start."""
        before = prepared.before
        held = sum(b["tokens"] for b in before.blocks if b.get("role") != "breadcrumb")
        reused = int(getattr(reply, "reused_tokens", 0))
        opening = int(getattr(reply, "opening_tokens", 0))     # the generation prompt the template adds
        decoded = int(reply.prefill_tokens) + opening + prepared.opened_tokens
        prompt = held + int(reply.prefill_tokens) + opening + reused
        if prepared.route == "import":       # the rebuilt history was decoded for this request too
            decoded += held - before.prefix_tokens
        decoded = min(decoded, prompt - reused)
        first = prepared.first_token_at
        ttft_s = first - prepared.arrived if first is not None and prepared.arrived else float(reply.ttft_s)
        waited_s = float(getattr(prepared.future, "waited_s", 0.0))       # queued behind other replies
        decode_s = float(getattr(reply, "decode_s", 0.0))
        return {"prompt_tokens": prompt, "completion_tokens": int(reply.n_tokens),
                "total_tokens": prompt + int(reply.n_tokens),
                "evoke": {"active": after.active_tokens, "budget": after.budget_tokens,
                          "cached": prompt - decoded - reused, "decoded": decoded, "reused": reused,
                          "evictions": after.evictions - before.evictions,
                          "recoveries": after.recoveries - before.recoveries,
                          "conversation_id": prepared.conv.id, "route": prepared.route,
                          "ttft_ms": round(ttft_s * 1000, 1),
                          "engine_ttft_ms": round(float(reply.ttft_s) * 1000, 1),
                          "queue_ms": round(waited_s * 1000, 1),
                          "tokens_per_s": round(int(reply.n_tokens) / decode_s, 2) if decode_s > 0 else 0.0}}

    def release(self, prepared: Prepared, loop: asyncio.AbstractEventLoop) -> None:
        """Free the conversation's lock once its turn has ended (also after a cancel), first removing what a
        stateless request that came to nothing left (`abandon`)."""
        def settle() -> None:
            if self.came_to_nothing(prepared):
                task = loop.create_task(self._abandon_then_release(prepared))
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)
            else:
                prepared.lock.release()
                self.keep_live(prepared.conv.id, prepared.owner)

        future = prepared.future
        if future is None or future.done():
            loop.call_soon_threadsafe(settle)
        else:
            future.add_done_callback(lambda _: loop.call_soon_threadsafe(settle))

    def keep_live(self, conversation_id: str, owner: str) -> list[str]:
        """`conversation_id` (of `owner`) was just used: it is the most recent live API conversation; past the caps
        (`max_live_per_owner` of that owner, `max_live` in all) the least recently used others with no request
        running are released to their KV files (`Engine.release_soon`); their ids (event loop)."""
        self._live.pop(conversation_id, None)
        self._live[conversation_id] = owner
        self._released.pop(conversation_id, None)
        own = [c for c, o in self._live.items() if o == owner]
        over_own, over_all = len(own) - self.max_live_per_owner, len(self._live) - self.max_live
        victims: list[str] = []
        for cid, whose in self._live.items():        # least recently used first
            if over_own <= 0 and over_all <= 0:
                break
            lock = self._locks.get(cid)
            if cid == conversation_id or (lock is not None and lock.locked()):
                continue                             # a request of its own runs: it goes after that one
            if whose == owner and over_own > 0 or over_all > 0:
                victims.append(cid)
                over_own -= whose == owner
                over_all -= 1
        for cid in victims:
            whose = self._live.pop(cid)
            self._released[cid] = whose
            self._views.pop(cid, None)
            future = self.engine.release_soon(cid)
            future.add_done_callback(_log_release_failure(cid))
        while len(self._released) > REPLAYABLE_RELEASED:
            self._released.popitem(last=False)
        return victims

    async def _abandon_then_release(self, prepared: Prepared) -> None:
        try:
            await to_thread.run_sync(self.abandon, prepared)
        finally:
            prepared.lock.release()
            if prepared.made_here:
                self._locks.pop(prepared.conv.id, None)


def _log_release_failure(conversation_id: str) -> Callable[[Future], None]:
    def done(future: Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.warning("endpoint: releasing %s failed: %s", conversation_id, future.exception())
    return done


def finish_reason(stopped: str, has_calls: bool, unfinished_call: bool) -> str:
    """OpenAI's finish_reason of a chat reply: `length` for one cut short (max_tokens, the budget, the context)
    with a tool call left unfinished or no call at all, `tool_calls` when it holds calls, else `stop`."""
    cut = stopped not in ("eos", "stop", "cancelled")
    if cut and (unfinished_call or not has_calls):
        return "length"
    return "tool_calls" if has_calls else "stop"


async def cancel_on_disconnect(http, future: Future | None, cancel: Callable[[], None],
                               poll_s: float = 0.25) -> None:
    """Call `cancel` once the request's client has gone, unless its `future` is done first (the partial reply or
    text is kept): a chat turn's, a raw completion's."""
    while future is not None and not future.done():
        if await http.is_disconnected():
            cancel()
            return
        await asyncio.sleep(poll_s)
