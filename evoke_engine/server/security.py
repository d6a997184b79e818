"""Who may talk to the endpoint and how much they may send: bind address, Host header (DNS rebinding),
Bearer key, CORS, duplicate credential headers, body size and read time.

Invariants: loopback unless `allow_remote`; a request whose Host is not a loopback name or address (any form, port or
not), the bound address or a configured host is refused before any handler runs (403; 400 when it is not a
host[:port], user info included, or there are two); `framing_problem` names the request heads the h11 protocol refuses
before parsing (obs-fold, two Content-Length values, Content-Length with Transfer-Encoding); the key is compared in
constant time (hmac.compare_digest) and never logged; no CORS headers unless origins are configured; a request with
two Authorization (or session/client) headers is refused; a body is read whole before the app sees it, refused past
`max_request_bytes` (413, nothing tokenized), past `body_timeout_s` of silence, past `body_deadline_s` in all or
slower than `min_body_bytes_per_s` after `body_grace_s` (408, the connection closed).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]", "localhost.localdomain"}
OPEN_PATHS = {"/health"}             # answered without a key (still Host-checked)
SINGLE_HEADERS = ("authorization", "x-evoke-session", "x-evoke-client", "content-length")
MAX_HEADER_BYTES = 32 << 10


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    allow_remote: bool = False
    allowed_hosts: list[str] = field(default_factory=list)      # extra Host names accepted
    cors_origins: list[str] = field(default_factory=list)
    max_request_bytes: int = 8 << 20
    body_timeout_s: float = 15.0         # longest silence while a body arrives
    body_deadline_s: float = 60.0        # longest a whole body may take to arrive
    min_body_bytes_per_s: int = 1024     # slowest a body may arrive, averaged, once `body_grace_s` has passed
    body_grace_s: float = 5.0
    max_requests_per_client: int = 16    # requests one client (token, else address) may have open at once
    header_timeout_s: float = 10.0       # longest wait for a request's headers (slow-loris connections)
    max_connections: int = 64            # open connections (and requests) at once: past it, the idle go first
    max_sessions_per_client: int = 256   # named sessions one client keeps: past it, its own least recently used go
    max_sessions: int = 10_000           # named sessions in all: past it a new name is a 503 (none is forgotten)
    max_live_per_client: int = 4         # API conversations one client keeps live (in a slot or host RAM): past it,
                                         # its least recently used are saved to their KV files and released
    max_live: int = 16                   # live API conversations in all (the same, oldest first, whoever's)
    max_prefill_tokens: int = 0          # tokens one request may have decoded before its reply (0: the whole
                                         # context less the reply's room; lower it to bound one request's hold)

    def check_bind(self) -> str | None:
        """Raise when a non-loopback bind lacks `allow_remote`; return the warning to print when it has it."""
        if is_loopback(self.host):
            return None
        if not self.allow_remote:
            raise ValueError(f"refusing to listen on {self.host}: only loopback addresses unless --allow-remote")
        note = "" if self.api_key else " and no API key is set"
        return (f"WARNING: the endpoint listens on {self.host}:{self.port}, reachable from other machines{note}; "
                "anyone who can reach it can use the model and read the conversations it serves")

    def host_allowed(self, host_header: str) -> bool:
        return self.host_refusal(host_header) is None

    def host_refusal(self, host_header: str) -> tuple[int, str, str] | None:
        """None when the Host header names this server: any loopback form (`localhost`, `localhost.`,
        `127.0.0.1`, any 127/8 address, `[::1]`, `::1`, with or without a port), a configured host, or the remote
        bind address; else (400 when it is not a host[:port] at all, userinfo included; 403 otherwise, the
        DNS-rebinding refusal), the message and the error code."""
        name = host_name(host_header)
        if name is None:
            return (400, f"the Host header {host_header[:80]!r} is not a host name or address with an optional port "
                         "(no user info, no path)", "invalid_host")
        extra = {h.lower().rstrip(".") for h in self.allowed_hosts}
        if self.allow_remote and not is_loopback(self.host):
            extra.add(self.host.lower())
        if name in LOOPBACK_NAMES or name in extra or _is_loopback_ip(name):
            return None
        return 403, "requests must name this server by a loopback host (Host header refused)", "host_not_allowed"


_BRACKETED = re.compile(r"^\[([0-9a-f:.]+)\](?::([0-9]{0,5}))?$")
_NAME = re.compile(r"^([a-z0-9_.-]+)(?::([0-9]{0,5}))?$")


def host_name(header: str) -> str | None:
    """The host a Host header names, lower-case, without its port or a final dot (`[::1]` keeps its brackets);
    None when the header is not `host[:port]` (RFC 9110's uri-host: user info, a path, spaces or an out-of-range
    port make it malformed)."""
    header = header.strip().lower()
    bracketed = _BRACKETED.match(header)
    if bracketed:
        host, port = f"[{bracketed.group(1)}]", bracketed.group(2)
        if not _is_ip(bracketed.group(1)):
            return None
    elif header.count(":") > 1:                  # a bare IPv6 address (not RFC syntax, but unambiguous): no port
        host, port = header, None
        if not _is_ip(header):
            return None
    else:
        named = _NAME.match(header)
        if not named or named.group(1).strip(".") == "":
            return None
        host, port = named.group(1), named.group(2)
        host = host[:-1] if host.endswith(".") else host
    if port and int(port) > 65535:
        return None
    return host


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_loopback_ip(name: str) -> bool:
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)           # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback(host: str) -> bool:
    return host.lower() in LOOPBACK_NAMES or _is_loopback_ip(host)


def key_matches(expected: str, authorization: str | None) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    return hmac.compare_digest(expected.encode(), given.strip().encode())


class GuardMiddleware:
    """Pure ASGI (streams pass straight through): Host check, then the key."""

    def __init__(self, app, config: ServerConfig) -> None:
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        size = sum(len(k) + len(v) for k, v in raw)
        if size > MAX_HEADER_BYTES:
            await _refuse(send, 431, f"the request headers are {size} bytes; at most {MAX_HEADER_BYTES}",
                          "headers_too_large")
            return
        headers = dict(raw)
        counts = Counter(name for name, _ in raw)
        repeated = [name for name in SINGLE_HEADERS if counts[name] > 1]
        if repeated:
            await _refuse(send, 400, f"the request has {counts[repeated[0]]} {repeated[0]} headers; send one",
                          "duplicate_header")
            return
        refusal = self.config.host_refusal(headers.get("host", "")) if counts["host"] == 1 else \
            (400, f"the request has {counts['host']} Host headers; send one", "invalid_host")
        if refusal is not None:
            await _refuse(send, *refusal)
            return
        if (self.config.api_key and scope.get("method") != "OPTIONS" and scope.get("path") not in OPEN_PATHS
                and not key_matches(self.config.api_key, headers.get("authorization"))):
            await _refuse(send, 401, "invalid or missing API key (send Authorization: Bearer <key>)",
                          "invalid_api_key")
            return
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            receive = await self._read_body(headers, receive, send)
            if receive is None:
                return
        await self.app(scope, receive, send)

    async def _read_body(self, headers: dict[str, str], receive, send):
        """The whole body within the size and time limits, replayed to the app; None when refused."""
        limit = self.config.max_request_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, 413, f"the request body is {int(declared)} bytes; this server reads at most "
                                     f"{limit} (the server_max_request_bytes setting)", "request_too_large")
            return None
        body = bytearray()
        config, loop = self.config, asyncio.get_running_loop()
        started = loop.time()
        while True:
            elapsed = loop.time() - started
            rate_due = config.body_grace_s + len(body) / config.min_body_bytes_per_s - elapsed \
                if config.min_body_bytes_per_s > 0 else config.body_deadline_s
            wait_s = max(0.0, min(config.body_timeout_s, config.body_deadline_s - elapsed, rate_due))
            try:
                message = await asyncio.wait_for(receive(), wait_s)
            except TimeoutError:
                await _refuse(send, 408, _slow_body(config, len(body), loop.time() - started), "request_timeout")
                return None
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                await _refuse(send, 413, f"the request body is over {limit} bytes, the most this server reads "
                                         "(the server_max_request_bytes setting)", "request_too_large")
                return None
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()
        return replay


def _slow_body(config: ServerConfig, received: int, elapsed_s: float) -> str:
    if elapsed_s >= config.body_deadline_s:
        return f"the request body took over {config.body_deadline_s:g} s to arrive, the most this server waits"
    if elapsed_s >= config.body_grace_s and config.min_body_bytes_per_s > 0 \
            and received < config.min_body_bytes_per_s * (elapsed_s - config.body_grace_s) + 1:
        return (f"the request body arrives at {received / max(elapsed_s, 1e-3):.0f} bytes/s, under the "
                f"{config.min_body_bytes_per_s} bytes/s this server needs")
    return f"the request body stopped arriving for {config.body_timeout_s:g} s"


HEAD_END = re.compile(rb"\r?\n\r?\n")


def framing_problem(head: bytes) -> str | None:
    """Why a request's head (its bytes up to the blank line) is refused before h11 parses it, or None: h11 unfolds
    obs-folded lines, merges identical Content-Length headers and lets Transfer-Encoding win over Content-Length;
    each is a request-smuggling ambiguity that RFC 9112 lets a server refuse, so this server refuses all three."""
    lines = head.split(b"\n")[1:]               # the request line first
    lengths = 0
    chunked = False
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            return "a header line is folded (obs-fold: a line that starts with a space or tab); send it on one line"
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            lengths += 1 + value.count(b",")
        elif name == b"transfer-encoding":
            chunked = True
    if lengths > 1:
        return f"the request has {lengths} Content-Length values; send one"
    if lengths and chunked:
        return "the request has both Content-Length and Transfer-Encoding; send one of them"
    return None


def raw_400(message: str, code: str, status: bytes = b"400 Bad Request") -> bytes:
    """A whole OpenAI-shaped HTTP/1.1 error (400 unless `status` says otherwise) that closes the connection (for a
    request refused before the app, or in its framing)."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                 "param": None}}).encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


async def _refuse(send, status: int, message: str, code: str) -> None:
    kind = {401: "authentication_error", 403: "permission_error"}.get(status, "invalid_request_error")
    body = json.dumps({"error": {"message": message, "type": kind, "code": code, "param": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 408:
        headers.append((b"connection", b"close"))        # the rest of a slow body is not waited for
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
