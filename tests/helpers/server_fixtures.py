"""Shared by the endpoint tests: a real engine on the embedded model behind a server on an ephemeral
loopback port that stops by itself (a lifetime), and the official `openai` client pointed at it."""

from __future__ import annotations

import contextlib

import openai

from evoke_engine import Engine, Settings
from evoke_engine.server import EndpointServer, ServerConfig
from evoke_engine.server.clients import new_token

LIFETIME_S = 900          # a server left behind by a failed test stops by itself


@contextlib.contextmanager
def running_server(home, *, api_key=None, settings=None, **config):
    engine = Engine(settings or Settings(home=str(home), budget_tokens=512, temperature=0.0), scheduler=False)
    try:
        with EndpointServer(engine, ServerConfig(host="127.0.0.1", port=0, api_key=api_key, **config),
                            lifetime_s=LIFETIME_S) as server:
            yield engine, server
    finally:
        engine.close()


def client_for(server, api_key="unused", *, client_token: str | None = None, **kw) -> openai.OpenAI:
    """An OpenAI client that keeps one client token (`X-Evoke-Client`), as a configured tool would."""
    headers = {"X-Evoke-Client": client_token or new_token(), **kw.pop("default_headers", {})}
    return openai.OpenAI(base_url=server.address, api_key=api_key, max_retries=0, timeout=300,
                         default_headers=headers, **kw)
