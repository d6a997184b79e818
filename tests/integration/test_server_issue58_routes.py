"""Issue 58 item 10, routes other tools call, on the real embedded model: llama-server's /infill, /tokenize,
/detokenize and /props."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
from helpers.server_fixtures import client_for, running_server

from evoke_engine import Settings
from evoke_engine.server.api_errors import context_tokens
from evoke_engine.server.llama_routes import MAX_TOKENIZE_CHARS, SNIPPET_SEPARATOR, InfillRequest, infill_tokens


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("issue58_routes")) as (engine, server):
        yield engine, server, client_for(server)


def base(server) -> str:
    return server.address.removesuffix("/v1")


# -- llama-server's routes -------------------------------------------------------------------------------------------
def test_tokenize_and_detokenize_round_trip(served):
    engine, server, _ = served
    text = "Hello wörld, <|im_start|> here"
    plain = httpx.post(base(server) + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    assert plain == engine.tokenize(text, special=True)
    pieces = httpx.post(base(server) + "/tokenize", json={"content": text, "with_pieces": True}, timeout=30).json()
    assert [p["id"] for p in pieces["tokens"]] == plain
    assert "".join(p["piece"] if isinstance(p["piece"], str) else bytes(p["piece"]).decode("latin-1")
                   for p in pieces["tokens"]) == text
    back = httpx.post(base(server) + "/detokenize", json={"tokens": plain}, timeout=30).json()
    assert back == {"content": text}


def test_tokenize_and_detokenize_refuse_bad_and_huge_input(served):
    _, server, _ = served
    bad = httpx.post(base(server) + "/detokenize", json={"tokens": [1, 10**8]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    huge = httpx.post(base(server) + "/tokenize", json={"content": "a" * (MAX_TOKENIZE_CHARS + 1)}, timeout=30)
    assert huge.status_code == 413 and huge.json()["error"]["param"] == "content"


def test_props_describe_the_loaded_model(served):
    engine, server, _ = served
    props = httpx.get(base(server) + "/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == context_tokens(engine.settings)
    assert props["total_slots"] == engine.settings.slots
    assert props["model_path"].endswith(".gguf") and "<|im_start|>" in props["chat_template"]
    assert props["build_info"].startswith("evoke-desk") and props["infill"] is False
    refused = httpx.post(base(server) + "/props", json={}, timeout=30)      # llama-server's settings change
    assert refused.status_code == 405 and "error" in refused.json()


def test_infill_without_fim_tokens_names_the_completions_route(served):
    _, server, _ = served
    refused = httpx.post(base(server) + "/infill", json={"input_prefix": "def add(a, b):\n    return ",
                                                         "input_suffix": "\n", "n_predict": 8}, timeout=30)
    assert refused.status_code == 501
    assert "/v1/completions" in refused.json()["error"]["message"]


class FimVocab:
    """The served vocabulary with a fill-in-the-middle layout of plain text (SmolLM2 has no FIM tokens)."""

    def __init__(self, vocab) -> None:
        self.vocab = vocab

    def __getattr__(self, name):
        return getattr(self.vocab, name)

    def infill(self, prefix: str, suffix: str) -> list[int]:
        return self.vocab.tokenize(f"<suffix>{suffix}</suffix>\n{prefix}", add_special=True, parse_special=False)


def test_infill_serves_llama_servers_shape_whole_and_streamed(served, monkeypatch):
    _, server, _ = served
    service = server.app.state.service
    real = service.vocabulary()
    monkeypatch.setattr(service, "vocabulary", lambda: FimVocab(real))
    body = {"input_prefix": "numbers = [1, 2, 3, ", "input_suffix": "]\n", "prompt": "", "n_predict": 6,
            "temperature": 0.0, "input_extra": [{"filename": "a.py", "text": "x = 1\n"}]}
    whole = httpx.post(base(server) + "/infill", json=body, timeout=120).json()
    assert whole["stop"] is True and isinstance(whole["content"], str) and whole["tokens_predicted"] <= 6
    assert whole["timings"]["predicted_n"] == whole["tokens_predicted"] and whole["tokens_evaluated"] > 0
    with httpx.stream("POST", base(server) + "/infill", json={**body, "stream": True}, timeout=120) as streamed:
        lines = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    assert all(not line["stop"] for line in lines[:-1]) and lines[-1]["stop"] is True
    assert "".join(line["content"] for line in lines) == whole["content"]


def test_infill_extra_context_is_dropped_oldest_first_to_fit():
    vocab = SimpleNamespace(infill=lambda prefix, suffix: list(range(len(prefix) + len(suffix))))
    service = SimpleNamespace(vocabulary=lambda: vocab, prefill_limit=lambda: 10_000)
    engine = SimpleNamespace(settings=Settings(n_ctx=4096, slots=2, max_tokens=512))
    room = context_tokens(engine.settings)
    old, new = "o" * (room - 100), "n" * (room // 8)      # both together do not fit, the newer alone does
    request = InfillRequest(input_prefix="ab", input_suffix="c", n_predict=16,
                            input_extra=[{"filename": "old.py", "text": old}, {"filename": "new.py", "text": new}])
    tokens, max_tokens = infill_tokens(engine, service, request)
    expected = f"{SNIPPET_SEPARATOR}new.py\n{new}{SNIPPET_SEPARATOR}ab"
    assert max_tokens == 16 and len(tokens) == len(expected) + 1
