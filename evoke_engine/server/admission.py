"""Admission: how many requests the endpoint serves at once, in all and per client, refused OpenAI-shaped.

Invariants: a request holds its place from the moment its headers arrive (so a body still trickling in counts)
until its response has ended, streamed or not; nothing is tokenized or read before a place is taken. A place
belongs to a share keyed only on what the head proves (issue 57): a client token this server knows (one that owns
API conversations or sessions: `known`) is its own trusted share; the API key without a token is one trusted share;
a well-formed token the server does not know yet is its own share among the untrusted; a request with neither is
the one anonymous share of its remote address (on loopback: every token-less client together). A malformed
`X-Evoke-Client` is a 400 on the head, before its body is read, and never a share. One share holds at most
`per_client` places (429 past it), all requests at most `max_requests` (503), and untrusted shares together at most
`max_requests - reserved_for_known(max_requests)` (503): junk tokens, new tokens and token-less clients can never
take the places kept for the clients the server knows. Every refusal is JSON with `Retry-After` (the 400 without).
Counters live on the event loop's thread only.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .clients import CLIENT_HEADER, KEY_OWNER, invalid_token_message, owner_of_token, well_formed
from .security import key_matches

RETRY_AFTER_S = 1


def shaped_refusal(status: int, message: str, code: str, retry_after_s: int = RETRY_AFTER_S,
                   param: str | None = None) -> tuple[list, bytes]:
    """The headers and body of a 429 or 503 as OpenAI sends them (`Retry-After` says when to try again), or of a 400
    (no `Retry-After`: the same request would be refused again)."""
    kind = {429: "rate_limit_error", 400: "invalid_request_error"}.get(status, "server_error")
    body = json.dumps({"error": {"message": message, "type": kind, "code": code, "param": param}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status != 400:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    headers.append((b"connection", b"close"))
    return headers, body


def raw_503(message: str) -> bytes:
    """A whole HTTP/1.1 503 response (for a connection refused before any request was parsed)."""
    headers, body = shaped_refusal(503, message, "server_busy")
    head = b"HTTP/1.1 503 Service Unavailable\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    return head + b"\r\n" + body


@dataclass(frozen=True)
class Share:
    """Whose places a request takes: `key` names the share, `trusted` says whether it may use the places kept for
    the clients the server knows."""
    key: str
    trusted: bool


class MalformedToken(ValueError):
    """The request's `X-Evoke-Client` is not a token this server would accept (refused on the head)."""


def reserved_for_known(max_requests: int) -> int:
    """Places untrusted shares never take: a quarter of all, at least one (none when there is only one)."""
    return min(max(1, max_requests // 4), max_requests - 1)


def _header(scope, name: bytes) -> bytes | None:
    for header, value in scope.get("headers", []):
        if header.lower() == name:
            return value
    return None


def share_of(scope, known: Callable[[str], bool], api_key: str | None = None) -> Share:
    """The share of a request from its head alone: its client token when the server knows it (trusted), the API key
    (trusted), a well-formed token it does not know (untrusted, its own share), else the anonymous share of its
    remote address; MalformedToken for a malformed `X-Evoke-Client`."""
    raw = _header(scope, CLIENT_HEADER.lower().encode())
    if raw is not None and raw.strip():
        token = raw.decode("latin-1").strip()
        if not well_formed(token):
            raise MalformedToken(invalid_token_message())
        owner = owner_of_token(token)
        if known(owner):
            return Share("known:" + owner, trusted=True)
        if not api_key:
            return Share("new:" + owner, trusted=False)
    if api_key:
        authorization = _header(scope, b"authorization")
        if key_matches(api_key, authorization.decode("latin-1") if authorization is not None else None):
            return Share(KEY_OWNER, trusted=True)
        return Share("unauthorized", trusted=False)           # the key check (401) follows at once
    client = scope.get("client")
    return Share(f"anonymous:{client[0] if client else '?'}", trusted=False)


class AdmissionMiddleware:
    """Pure ASGI, outside the body reader: each HTTP request takes a place, in all and for its client."""

    def __init__(self, app, max_requests: int, per_client: int, known: Callable[[str], bool] | None = None,
                 api_key: str | None = None) -> None:
        self.app = app
        self.max_requests, self.per_client = max_requests, min(per_client, max_requests)
        self.untrusted_max = max_requests - reserved_for_known(max_requests)
        self.known = known or (lambda _owner: False)
        self.api_key = api_key
        self.in_flight = 0
        self.untrusted = 0                     # places held by untrusted shares
        self.by_client: Counter[str] = Counter()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            share = share_of(scope, self.known, self.api_key)
        except MalformedToken as exc:
            await self._refuse(send, 400, str(exc), "invalid_client_token", CLIENT_HEADER)
            return
        refusal = self._refusal(share)
        if refusal is not None:
            await self._refuse(send, *refusal)
            return
        self._take(share)
        try:
            await self.app(scope, receive, send)
        finally:
            self._give_back(share)

    def _refusal(self, share: Share) -> tuple[int, str, str] | None:
        """(status, message, code) when `share` may not take one more place now, else None."""
        if self.in_flight >= self.max_requests:
            return 503, (f"the server is serving {self.in_flight} requests, the most it takes at once; try again "
                         "shortly"), "server_busy"
        if self.by_client[share.key] >= self.per_client:
            return 429, (f"this client has {self.by_client[share.key]} requests open, the most one client may have "
                         "at once; wait for one to end"), "too_many_requests"
        if not share.trusted and self.untrusted >= self.untrusted_max:
            return 503, (f"the server is serving {self.untrusted} requests of new or anonymous clients, the most it "
                         f"takes at once (send the {CLIENT_HEADER} token you were handed to be served as a known "
                         "client); try again shortly"), "server_busy"
        return None

    def _take(self, share: Share) -> None:
        self.in_flight += 1
        self.untrusted += not share.trusted
        self.by_client[share.key] += 1

    def _give_back(self, share: Share) -> None:
        self.in_flight -= 1
        self.untrusted -= not share.trusted
        self.by_client[share.key] -= 1
        if self.by_client[share.key] <= 0:
            del self.by_client[share.key]

    @staticmethod
    async def _refuse(send, status: int, message: str, code: str, param: str | None = None) -> None:
        headers, body = shaped_refusal(status, message, code, param=param)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
