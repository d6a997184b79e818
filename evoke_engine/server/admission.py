"""Admission: how many requests the endpoint serves at once, in all and per client, refused OpenAI-shaped.

Invariants: a request holds its place from the moment its headers arrive (so a body still trickling in counts)
until its response has ended, streamed or not; a client is its `X-Evoke-Client` token (by its SHA-256) or, without
one, its remote address, so one client holds at most `per_client` places and others keep the rest; past the
per-client share the answer is 429, past the total 503, both JSON with `Retry-After`; nothing is tokenized or
read before a place is taken. Counters live on the event loop's thread only.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

RETRY_AFTER_S = 1


def shaped_refusal(status: int, message: str, code: str, retry_after_s: int = RETRY_AFTER_S) -> tuple[list, bytes]:
    """The headers and body of a 429 or 503 as OpenAI sends them (`Retry-After` says when to try again)."""
    kind = "rate_limit_error" if status == 429 else "server_error"
    body = json.dumps({"error": {"message": message, "type": kind, "code": code, "param": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(retry_after_s).encode()), (b"connection", b"close")]
    return headers, body


def raw_503(message: str) -> bytes:
    """A whole HTTP/1.1 503 response (for a connection refused before any request was parsed)."""
    headers, body = shaped_refusal(503, message, "server_busy")
    head = b"HTTP/1.1 503 Service Unavailable\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    return head + b"\r\n" + body


def client_key(scope) -> str:
    """Who a request comes from, for the per-client share: its client token, else its remote address."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"x-evoke-client" and value.strip():
            return "token:" + hashlib.sha256(value.strip()).hexdigest()[:24]
    client = scope.get("client")
    return f"address:{client[0] if client else '?'}"


class AdmissionMiddleware:
    """Pure ASGI, outside the body reader: each HTTP request takes a place, in all and for its client."""

    def __init__(self, app, max_requests: int, per_client: int) -> None:
        self.app = app
        self.max_requests, self.per_client = max_requests, min(per_client, max_requests)
        self.in_flight = 0
        self.by_client: Counter[str] = Counter()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = client_key(scope)
        if self.in_flight >= self.max_requests:
            await self._refuse(send, 503, f"the server is serving {self.in_flight} requests, the most it takes at "
                                          "once; try again shortly", "server_busy")
            return
        if self.by_client[key] >= self.per_client:
            await self._refuse(send, 429, f"this client has {self.by_client[key]} requests open, the most one "
                                          "client may have at once; wait for one to end", "too_many_requests")
            return
        self.in_flight += 1
        self.by_client[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.by_client[key] -= 1
            if self.by_client[key] <= 0:
                del self.by_client[key]

    @staticmethod
    async def _refuse(send, status: int, message: str, code: str) -> None:
        headers, body = shaped_refusal(status, message, code)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
