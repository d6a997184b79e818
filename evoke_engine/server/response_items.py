"""A Responses API reply's output items (messages, function calls) built from the `CallReader` that reads it, in the
order the model wrote them, and the events that announce, grow and close each one as OpenAI's Responses stream does.

Invariants: one item is open at a time and every event names its `output_index`; a function call is announced with
its `call_id`, name and empty arguments as soon as the reader opens it, its arguments' pieces follow as written and
join to the item's `arguments` (so a streamed and a whole reply, read by the same reader, give the same items); a
call the reader never finished closes `incomplete`; a message holds no whitespace at a call's edges.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable

from .toolcall_stream import CallReader, Delta, StreamedCall

Event = tuple[str, dict]          # (event type, its fields but `type` and `sequence_number`)


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(16)


def message_item(message_id: str, text: str, status: str) -> dict:
    return {"id": message_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": "fc_" + call_id.removeprefix("call_"), "type": "function_call", "status": status,
            "call_id": call_id, "name": name, "arguments": arguments}


class OutputItems:
    """The output items of one reply: `add` the reader's deltas as they come (`feed`, then `close`), then `end`;
    each returns the events to send. `output` holds the closed items, in order."""

    def __init__(self, reader: CallReader, first_message_id: str,
                 new_id: Callable[[], str] = new_message_id) -> None:
        self.reader = reader
        self.output: list[dict] = []
        self.open: dict | None = None             # the item being written
        self.call: StreamedCall | None = None     # the open item's call, when it is one
        self.held = ""                            # whitespace not sent yet: it may stand before a call
        self.any_call = False
        self._first_id, self._new_id = first_message_id, new_id

    @property
    def index(self) -> int:
        return len(self.output)

    def add(self, deltas: Iterable[Delta]) -> list[Event]:
        out: list[Event] = []
        for delta in deltas:
            if delta.kind == "content":
                self._content(delta.text, out)
            elif delta.kind == "opened":
                self._close("completed", out)
                self._open_call(self.reader.calls[delta.index], out)
            elif self.open is not None and self.call is self.reader.calls[delta.index]:
                self.open["arguments"] += delta.text
                out.append(("response.function_call_arguments.delta",
                            {"item_id": self.open["id"], "output_index": self.index, "delta": delta.text}))
        call = self.call
        if call is not None and call.finished and self.reader.call is not call and not self.reader.after_call:
            self._close("completed", out)            # read to its end (a Hermes call: its closing tag too)
        return out

    def end(self, status: str) -> list[Event]:
        """The events that close the reply (`status`: its last message's, `completed` or `incomplete`), once the
        reader is closed; a reply with no item at all gets an empty message."""
        out: list[Event] = []
        if self.held and not self.any_call and not self.reader.unfinished:
            self._text(self.held, out)                # text without calls goes back as written, spacing too
        self.held = ""
        if self.open is None and not self.output:
            self._open_message(out)
        self._close(status, out)
        return out

    # -- messages ------------------------------------------------------------------------------------------------
    def _content(self, text: str, out: list[Event]) -> None:
        if self.call is not None:
            self._close("completed", out)            # a call that turned out no call: incomplete
        pending = self.held + text
        if self.open is None and self.output and self.output[-1]["type"] == "function_call":
            pending = pending.lstrip()
        body = pending.rstrip()
        self.held = pending[len(body):]
        if body:
            self._text(body, out)

    def _text(self, text: str, out: list[Event]) -> None:
        if self.open is None:
            self._open_message(out)
        self.open["content"][0]["text"] += text
        out.append(("response.output_text.delta", {**self._part(), "delta": text, "logprobs": []}))

    def _open_message(self, out: list[Event]) -> None:
        message_id = self._new_id() if self._first_id is None else self._first_id
        self._first_id = None
        self.open = message_item(message_id, "", "in_progress")
        out.append(("response.output_item.added", {"output_index": self.index,
                                                   "item": {**self.open, "content": []}}))
        out.append(("response.content_part.added", {**self._part(), "part": {"type": "output_text", "text": "",
                                                                             "annotations": []}}))

    def _part(self) -> dict:
        return {"item_id": self.open["id"], "output_index": self.index, "content_index": 0}

    # -- calls ---------------------------------------------------------------------------------------------------
    def _open_call(self, call: StreamedCall, out: list[Event]) -> None:
        self.held, self.any_call, self.call = "", True, call
        self.open = call_item(call.call_id, call.name, "", "in_progress")
        out.append(("response.output_item.added", {"output_index": self.index, "item": dict(self.open)}))

    # -- closing -------------------------------------------------------------------------------------------------
    def _close(self, status: str, out: list[Event]) -> None:
        item, call = self.open, self.call
        if item is None:
            return
        if call is not None:
            item["status"] = "completed" if call.finished else "incomplete"
            if call.finished:
                out.append(("response.function_call_arguments.done", {"item_id": item["id"],
                                                                      "output_index": self.index,
                                                                      "name": item["name"],
                                                                      "arguments": item["arguments"]}))
        else:
            self.held = ""
            item["status"] = status
            text = item["content"][0]["text"]
            out.append(("response.output_text.done", {**self._part(), "text": text, "logprobs": []}))
            out.append(("response.content_part.done", {**self._part(), "part": dict(item["content"][0])}))
        out.append(("response.output_item.done", {"output_index": self.index, "item": dict(item)}))
        self.output.append(item)
        self.open = self.call = None
