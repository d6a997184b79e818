"""Who a request comes from, for the session namespace: the credential that owns a session is the client token
(`X-Evoke-Client`) when one is sent, else the API key when the server has one, else a fresh token handed out.

A request with neither a token nor the key is its own throwaway client (issue 57): the owner of the fresh token it is
handed, so it never continues another token-less request's conversation by re-sending its history, chunk reuse
never answers across two of them, and only a client that keeps the token it was handed (sends it back) continues
what that request made.

Invariants: a session name or a conversation id never names an owner; tokens are compared by their SHA-256
only (never stored or logged in clear); a token is at least `MIN_TOKEN_CHARS` characters of URL-safe text, so
one a client picks for itself (a fixed header in its config) is as hard to guess as one the server mints.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from .api_errors import ApiError

CLIENT_HEADER = "X-Evoke-Client"
MIN_TOKEN_CHARS = 22                      # 22 URL-safe characters: 132 bits
TOKEN = re.compile(rf"^[A-Za-z0-9_-]{{{MIN_TOKEN_CHARS},128}}$")
KEY_OWNER = "key"                          # every holder of the server's API key is one credential
ANONYMOUS_OWNER = "anonymous"              # requests with neither a token nor a key, for prefix routing only


@dataclass(frozen=True)
class Client:
    owner: str                              # the namespace of this client's sessions
    issued: str | None = None               # a token minted for this request, to send back in CLIENT_HEADER


def new_token() -> str:
    return secrets.token_urlsafe(24)


def owner_of_token(token: str) -> str:
    return "client:" + hashlib.sha256(token.encode()).hexdigest()[:32]


def well_formed(token: str) -> bool:
    """`token` (stripped) is one this server would accept as a client token."""
    return TOKEN.match(token.strip()) is not None


def invalid_token_message() -> str:
    return (f"{CLIENT_HEADER} must be {MIN_TOKEN_CHARS}-128 characters of letters, digits, '-' and '_' (a token this "
            "server handed out, or a random one you keep)")


def identify(token: str | None, api_key_set: bool) -> Client:
    """The client of a request, from its `X-Evoke-Client` header (or its key, or nothing)."""
    if token is not None and token.strip():
        token = token.strip()
        if not well_formed(token):
            raise ApiError(400, invalid_token_message(), "invalid_client_token", CLIENT_HEADER)
        return Client(owner_of_token(token))
    if api_key_set:
        return Client(KEY_OWNER)
    token = new_token()
    return Client(owner_of_token(token), issued=token)
