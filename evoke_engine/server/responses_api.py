"""`POST /v1/responses`: OpenAI's Responses API (Codex CLI, the Agents SDK) as a front of the chat route: a request is
translated into a `ChatRequest` and runs the same prepare, submit and finish as /v1/chat/completions; the reply
comes back as output items (a message, function calls), whole or as the Responses SSE events.

Invariants: what the chat route cannot honour is a 400 naming the field or the input item (built-in tools, reasoning,
background, images); a stored response (`store`, the default) keeps its owner, its conversation and its own messages,
bounded in count and bytes (`ResponseStore`), and `previous_response_id` continues that conversation as its owner:
the history is the chain's messages, sent as the conversation's id, so the engine decodes only the new input (a
conversation gone or changed is rebuilt from that history); a response id is minted with 192 random bits and is the
credential of a request without a client token, while one with a token (or the key) continues only its own; an
unknown or forgotten id is OpenAI's `previous_response_not_found`; a stream's response is stored before its
`response.completed` event, so the next request may name it at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from anyio import to_thread
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError

from .. import DISK_FULL, Engine, GrammarError, StoreError
from ..errors import BudgetError, EvokeError
from .api_errors import ApiError, overflow
from .clients import CLIENT_HEADER, Client, identify
from .constraints import grammar_for
from .metrics import Metrics
from .request_bodies import ChatRequest, Loose, check_body
from .response_items import OutputItems
from .service import ChatService, Outcome, Prepared, cancel_on_disconnect
from .stored_start import QUEUED_PING_S, start_stored
from .toolcall_formats import loaded_format
from .toolcall_stream import CallReader

PING_S = 5.0                 # an SSE comment this often while no token comes
MAX_STORED = 4096            # responses kept for `previous_response_id`
MAX_STORED_BYTES = 64 << 20  # and their messages' bytes in all (least recently used forgotten first)
# Responses fields the chat route does not honour: set to anything but these values, they are a 400 naming them
REFUSED_FIELDS = {"background": (None, False), "conversation": (None,), "prompt": (None,), "max_tool_calls": (None,),
                  "top_logprobs": (None, 0), "truncation": (None, "disabled")}
IGNORED_INCLUDES = {"reasoning.encrypted_content"}      # nothing to include: this server writes no reasoning items
TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(Loose):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=2.0)
    top_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    stream: StrictBool = False
    previous_response_id: str | None = None
    store: StrictBool | None = None            # None: OpenAI's default, stored
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None

    def refusal(self) -> str | None:
        """The first field set to something the chat route does not honour, or None."""
        for key, value in (self.model_extra or {}).items():
            if key in REFUSED_FIELDS and value not in REFUSED_FIELDS[key]:
                return key
        if self.reasoning and any(v is not None for v in self.reasoning.values()):
            return "reasoning"
        if any(name not in IGNORED_INCLUDES for name in self.include or []):
            return "include"
        return None

    @property
    def stored(self) -> bool:
        return self.store is not False


# -- the request as a chat request -------------------------------------------------------------------------------------
def _refuse(param: str, message: str, code: str = "unsupported_parameter") -> ApiError:
    return ApiError(400, f"{param}: {message}", code, param)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _refuse(where, "a string is required", "invalid_request")
    return value


def _content(content: Any, where: str, role: str) -> str | list[dict]:
    """A message's content as the chat route takes it: text, or text and file parts (a user's)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(where, "a string or a list of content parts is required", "invalid_request")
    parts: list[dict] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append({"type": "text", "text": _text(part.get("text"), f"{where}[{j}].text")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _text(part.get("refusal"), f"{where}[{j}].refusal")})
        elif kind == "input_file" and role != "assistant" and isinstance(part.get("file_data"), str):
            parts.append({"type": "file", "file": {"filename": part.get("filename"), "file_data": part["file_data"]}})
        else:
            raise _refuse(f"{where}[{j}].type", f"content of type {kind!r} is not supported by this server (text, "
                                                "and files sent inline as file_data, are)")
    if role == "assistant" or all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def input_messages(value: str | list[dict[str, Any]]) -> list[dict]:
    """The Responses `input` as chat messages: messages, function calls (an assistant message's `tool_calls`) and
    their outputs (tool messages); any other item is a 400 naming it."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _refuse(f"{where}.role", f"{role!r} is not a message role (user, system, developer, "
                                               "assistant)", "invalid_request")
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content", role)})
        elif kind == "function_call":
            call = {"id": _text(item.get("call_id"), f"{where}.call_id"), "type": "function",
                    "function": {"name": _text(item.get("name"), f"{where}.name"),
                                 "arguments": _text(item.get("arguments", "{}"), f"{where}.arguments")}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)     # one reply: its text and its calls
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output", "assistant")
            out.append({"role": "tool", "tool_call_id": _text(item.get("call_id"), f"{where}.call_id"),
                        "content": text})
        else:
            raise _refuse(f"{where}.type", f"input items of type {kind!r} are not supported by this server "
                                           "(message, function_call and function_call_output are)",
                          "unsupported_input_item")
    return out


def with_call_names(messages: list[dict]) -> list[dict]:
    """Tool messages named after the call they answer (the chat template shows the tool's name)."""
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls") or []}
    return [{**m, "name": names[m["tool_call_id"]]} if m["role"] == "tool" and m["tool_call_id"] in names else m
            for m in messages]


def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Responses function tools (name, description, parameters at the top) as chat tools; built-in ones refused."""
    out = []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind != "function":
            raise _refuse(f"tools[{i}].type", f"{kind!r} is a built-in tool this server does not have (it runs a "
                                              "local model: no web search, file search, computer or code "
                                              "interpreter); declare a function tool and run it yourself",
                          "unsupported_tool")
        spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool    # the chat shape too
        function = {"name": _text(spec.get("name"), f"tools[{i}].name")}
        for key in ("description", "parameters"):
            if spec.get(key) is not None:
                function[key] = spec[key]
        out.append({"type": "function", "function": function})
    return out or None


def chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _refuse("tool_choice", f"{choice!r} is not supported (auto, none, required, or "
                                 '{"type": "function", "name": ...})')


def chat_response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema"),
                                                       "strict": fmt.get("strict")}}
    raise _refuse("text.format", f"type {fmt.get('type')!r} is not supported (text, json_object, json_schema)")


def chat_request(request: ResponsesRequest, messages: list[dict]) -> ChatRequest:
    body = {"model": request.model, "messages": messages, "max_tokens": request.max_output_tokens,
            "temperature": request.temperature, "top_p": request.top_p, "stream": request.stream,
            "tools": chat_tools(request.tools), "tool_choice": chat_tool_choice(request.tool_choice),
            "response_format": chat_response_format(request.text)}
    try:
        return ChatRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _refuse("input", f"{'.'.join(str(x) for x in first.get('loc', ()))}: {first.get('msg')}",
                      "invalid_request") from exc


# -- stored responses ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class StoredResponse:
    owner: str
    conversation_id: str
    parent: str | None
    messages: list[dict]             # this response's input (less `instructions`) and its reply, as chat messages
    size: int = 0


class ResponseStore:
    """Response id -> StoredResponse, least recently used forgotten first past `max_count` or `max_bytes`."""

    def __init__(self, max_count: int = MAX_STORED, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        stored.size = len(json.dumps(stored.messages))
        with self._lock:
            self._items[response_id] = stored
            self._bytes += stored.size
            while self._items and (len(self._items) > self.max_count or self._bytes > self.max_bytes):
                _, gone = self._items.popitem(last=False)
                self._bytes -= gone.size

    def chain(self, response_id: str, owner: str | None) -> tuple[StoredResponse, list[dict]]:
        """The response and the messages of its whole chain, oldest first; `owner` None: any owner's (the id is
        the credential). 400 `previous_response_not_found` for an unknown, forgotten or another owner's id."""
        missing = ApiError(400, f"previous_response_id: no stored response {response_id!r} (an unknown id, one "
                                "sent with store: false, another client's, or one this server has forgotten); "
                                "send the whole conversation as input instead",
                           "previous_response_not_found", "previous_response_id")
        with self._lock:
            stored = self._items.get(response_id)
            if stored is None or (owner is not None and stored.owner != owner):
                raise missing
            parts, at = [], response_id
            while at is not None:
                link = self._items.get(at)
                if link is None:
                    raise missing
                self._items.move_to_end(at)
                parts.append(link.messages)
                at = link.parent
        return stored, [m for part in reversed(parts) for m in part]


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


# -- the route -------------------------------------------------------------------------------------------------------
def add_responses_routes(app: FastAPI, engine: Engine, service: ChatService, metrics: Metrics, config) -> None:
    store = app.state.responses = ResponseStore()

    @app.post("/v1/responses")
    async def responses(request: ResponsesRequest, http: Request, x_evoke_client: str | None = Header(default=None)):
        refused = request.refusal()
        if refused is not None:
            raise _refuse(refused, "not supported by this server; remove it from the request")
        client = identify(x_evoke_client, bool(config.api_key))
        session, history, parent_owner = None, [], None
        if request.previous_response_id:
            stored, history = store.chain(request.previous_response_id, None if client.issued else client.owner)
            session, parent_owner = stored.conversation_id, stored.owner
        new = input_messages(request.input)
        system = [{"role": "system", "content": request.instructions}] if request.instructions else []
        chat = chat_request(request, with_call_names(system + history + new))
        check_body(chat)
        model_id = await to_thread.run_sync(service.check_model, chat.model)
        try:
            grammar = await to_thread.run_sync(grammar_for, chat, loaded_format(engine))
        except ApiError as exc:
            raise _renamed(exc) from None
        routed = Client(parent_owner) if parent_owner is not None else dataclasses.replace(client, issued=None)
        if session is not None and not service.sessions.room_for(routed.owner, session):
            raise ApiError(503, "the server keeps the most conversations it can name; send the whole conversation "
                                "as input without previous_response_id", "too_many_sessions", "previous_response_id")
        try:
            prepared = await service.prepare(chat, session, routed, http.is_disconnected)
        except ApiError as exc:
            mapped = overflow(exc, engine)
            if mapped is exc:
                raise                                      # a storage failure among them: the app's handler words it
            raise mapped from exc
        if grammar is not None:
            prepared.sampling["grammar"] = grammar
        run = ResponseRun(request, model_id, new_response_id())
        headers = {"X-Evoke-Conversation": prepared.conv.id}
        if client.issued and parent_owner is None:
            headers[CLIENT_HEADER] = client.issued
        loop = asyncio.get_running_loop()

        def keep(outcome: Outcome) -> None:
            if request.stored:
                reply = {"role": "assistant", "content": outcome.content,
                         **({"tool_calls": outcome.tool_calls} if outcome.tool_calls else {})}
                store.put(run.id, StoredResponse(prepared.owner, prepared.conv.id, request.previous_response_id,
                                                 [*new, reply]))
        if request.stream:
            pieces: asyncio.Queue = asyncio.Queue()
            try:
                await start_stored(service, prepared, http, pieces, loop, ended=None)
            except BaseException as exc:
                service.release(prepared, loop)
                if isinstance(exc, (EvokeError, GrammarError)):
                    raise turn_error(exc, engine) from exc
                raise
            return StreamingResponse(run.stream(service, prepared, pieces, loop, metrics, keep),
                                     media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        watcher = None
        try:
            future = service.submit(prepared)
            watcher = asyncio.create_task(cancel_on_disconnect(http, prepared.future, prepared.conv.cancel))
            reply = await asyncio.wrap_future(future)
            reader, items = run.items(prepared)           # read whole as a stream reads it: the same items
            items.add(reader.feed(reply.text))
            items.add(reader.close())
            outcome = await to_thread.run_sync(service.finish, prepared, reply, reader)
            items.end(reply_status(outcome))
            metrics.observe(*split_usage(outcome.usage))
        except asyncio.CancelledError:
            prepared.conv.cancel()
            raise
        except (EvokeError, GrammarError) as exc:
            raise turn_error(exc, engine) from exc
        finally:
            if watcher is not None:
                watcher.cancel()
            service.release(prepared, loop)
        keep(outcome)
        return JSONResponse(run.finished(outcome, items.output), headers=headers)


def _renamed(exc: ApiError) -> ApiError:
    """A constraint's error naming this API's field (`text.format`) where the chat route names `response_format`."""
    if exc.param != "response_format":
        return exc
    return ApiError(exc.status, exc.message.replace("response_format", "text.format"), exc.code, "text.format")


def reply_status(outcome: Outcome) -> str:
    """The status of a reply's last item: `incomplete` when max_output_tokens (or the context) cut it short."""
    return "incomplete" if outcome.finish_reason == "length" else "completed"


def split_usage(usage: dict) -> tuple[dict, dict]:
    """The chat route's usage (OpenAI's fields) and the `evoke` figures, apart."""
    figures = dict(usage.get("evoke") or {})
    chat_usage = {k: v for k, v in usage.items() if k != "evoke"}
    chat_usage["prompt_tokens_details"] = {"cached_tokens": int(figures.get("cached", 0))}
    return chat_usage, figures


def responses_usage(usage: dict) -> dict:
    chat_usage, figures = split_usage(usage)
    return {"input_tokens": chat_usage["prompt_tokens"], "output_tokens": chat_usage["completion_tokens"],
            "total_tokens": chat_usage["total_tokens"],
            "input_tokens_details": {"cached_tokens": int(figures.get("cached", 0))},
            "output_tokens_details": {"reasoning_tokens": 0}}


def _storage_failure(exc: BaseException) -> StoreError | None:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None or isinstance(seen, StoreError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def turn_error(exc: EvokeError | GrammarError, engine: Engine) -> ApiError:
    """The error of a turn that failed before its response began (a storage failure is worded by the app's handler,
    which finds it as this error's cause)."""
    if isinstance(exc, BudgetError):
        return overflow(ApiError(400, str(exc), "context_length_exceeded", "input"), engine)
    if isinstance(exc, GrammarError):
        return ApiError(400, f"grammar: {exc}", "invalid_grammar", "text.format")
    return ApiError(500, f"generation failed: {exc}", "engine_error")


def stream_failure(exc: BaseException) -> dict:
    """`response.error` of a turn that failed once its stream had begun."""
    stored = _storage_failure(exc)
    if stored is not None:
        full = stored.reason == DISK_FULL
        return {"code": "insufficient_storage" if full else "storage_unavailable",
                "message": "the server's disk is full: the conversation cannot be stored" if full else
                           f"the server cannot use its chat history now ({stored.reason.replace('_', ' ')})"}
    if isinstance(exc, GrammarError):
        return {"code": "invalid_grammar", "message": f"grammar: {exc}"}
    return {"code": "engine_error", "message": f"generation failed: {exc}"}


class ResponseRun:
    """One response: its id, the request's settings echoed, its output items, whole or as SSE events."""

    def __init__(self, request: ResponsesRequest, model_id: str, response_id: str) -> None:
        self.request, self.model_id, self.id = request, model_id, response_id
        self.created = int(time.time())
        self.message_id = "msg_" + secrets.token_hex(16)
        self.sequence = itertools.count()

    def snapshot(self, status: str, output: list[dict], usage: dict | None = None, **extra) -> dict:
        r = self.request
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
                "incomplete_details": None, "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
                "model": self.model_id, "output": output,
                "parallel_tool_calls": r.parallel_tool_calls if r.parallel_tool_calls is not None else True,
                "previous_response_id": r.previous_response_id, "reasoning": {"effort": None, "summary": None},
                "store": r.stored, "temperature": r.temperature, "top_p": r.top_p,
                "text": r.text or {"format": {"type": "text"}}, "tool_choice": r.tool_choice or "auto",
                "tools": r.tools or [], "truncation": "disabled", "usage": usage, "user": r.user,
                "metadata": r.metadata or {}, **extra}

    def items(self, prepared: Prepared) -> tuple[CallReader, OutputItems]:
        """The reader of this reply (the one `service.finish` is given, so its calls and ids are what is stored)
        and the output items built from its deltas."""
        reader = CallReader(prepared.call_format, prepared.tool_names if prepared.tool_names else frozenset(),
                            forced=prepared.call_forced)
        return reader, OutputItems(reader, self.message_id)

    def finished(self, outcome: Outcome, output: list[dict]) -> dict:
        cut = reply_status(outcome) == "incomplete"
        return self.snapshot("incomplete" if cut else "completed", output, responses_usage(outcome.usage),
                             incomplete_details={"reason": "max_output_tokens"} if cut else None,
                             evoke=split_usage(outcome.usage)[1])

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": next(self.sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    async def stream(self, service: ChatService, prepared: Prepared, pieces: asyncio.Queue,
                     loop: asyncio.AbstractEventLoop, metrics: Metrics, keep) -> AsyncIterator[str]:
        reader, items = self.items(prepared)
        future = prepared.future
        position = service.engine.queue_position(future.job.id)
        try:
            yield self.event("response.created", response=self.snapshot("in_progress", []))
            yield self.event("response.in_progress", response=self.snapshot("in_progress", []))
            while True:
                try:
                    piece = await asyncio.wait_for(pieces.get(), QUEUED_PING_S if position else PING_S)
                except TimeoutError:
                    position = service.engine.queue_position(future.job.id)
                    yield f": queued {position}\n\n" if position else ": ping\n\n"
                    continue
                if piece is None:
                    break
                for kind, fields in items.add(reader.feed(piece)):
                    yield self.event(kind, **fields)
            try:
                reply = future.result()
            except (EvokeError, GrammarError) as exc:
                yield self.event("response.failed", response=self.snapshot("failed", [], error=stream_failure(exc)))
                return
            for kind, fields in items.add(reader.close()):
                yield self.event(kind, **fields)
            outcome = await to_thread.run_sync(service.finish, prepared, reply, reader)
            metrics.observe(*split_usage(outcome.usage))
            for kind, fields in items.end(reply_status(outcome)):
                yield self.event(kind, **fields)
            keep(outcome)                      # stored before the client hears it is done: it may continue at once
            final = self.finished(outcome, items.output)
            yield self.event("response.incomplete" if final["status"] == "incomplete" else "response.completed",
                             response=final)
        finally:
            if prepared.future is not None and not prepared.future.done():
                prepared.conv.cancel()             # the client went away: stop, keep the partial reply
            service.release(prepared, loop)
