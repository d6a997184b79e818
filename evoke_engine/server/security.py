"""Who may talk to the endpoint: bind address, Host header (DNS rebinding), Bearer key, CORS.

Invariants: loopback unless `allow_remote`; a request whose Host is not a loopback name, the bound
address or a configured host is refused before any handler runs; the key is compared in constant time
(hmac.compare_digest) and never logged; no CORS headers unless origins are configured.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]", "localhost.localdomain"}
OPEN_PATHS = {"/health"}             # answered without a key (still Host-checked)


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    allow_remote: bool = False
    allowed_hosts: list[str] = field(default_factory=list)      # extra Host names accepted
    cors_origins: list[str] = field(default_factory=list)

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
        name = _host_name(host_header)
        if not name:
            return False
        extra = {h.lower() for h in self.allowed_hosts}
        if self.allow_remote and not is_loopback(self.host):
            extra.add(self.host.lower())
        return name in LOOPBACK_NAMES or name in extra or _is_loopback_ip(name)


def _host_name(header: str) -> str:
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[:end + 1] if end > 0 else ""
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _is_loopback_ip(name: str) -> bool:
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


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
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self.config.host_allowed(headers.get("host", "")):
            await _refuse(send, 403, "requests must name this server by a loopback host (Host header refused)",
                          "host_not_allowed")
            return
        if (self.config.api_key and scope.get("method") != "OPTIONS" and scope.get("path") not in OPEN_PATHS
                and not key_matches(self.config.api_key, headers.get("authorization"))):
            await _refuse(send, 401, "invalid or missing API key (send Authorization: Bearer <key>)",
                          "invalid_api_key")
            return
        await self.app(scope, receive, send)


async def _refuse(send, status: int, message: str, code: str) -> None:
    kind = "authentication_error" if status == 401 else "permission_error"
    body = json.dumps({"error": {"message": message, "type": kind, "code": code, "param": None}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
