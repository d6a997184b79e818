"""Issue 57 item 7: a chunked body whose chunk size alone is past the largest request (20 hex digits pass h11's
parser) is refused at once with a shaped 413, instead of a 408 once the body's rate guard gives up."""

from __future__ import annotations

from integration.test_server_protocol42 import raw, request, served, shaped

__all__ = ["served"]                 # the module's server fixture, shared


def test_a_chunk_size_of_twenty_hex_digits_is_refused_at_once(served):
    _, server, _ = served
    headers = ["Host: 127.0.0.1", "Content-Type: application/json", "Transfer-Encoding: chunked"]
    status, payload, _seconds = raw(server, request("/v1/chat/completions", headers, b"FFFFFFFFFFFFFFFFFFFF\r\n{"),
                                    wait_s=4.0)     # the rate guard's 408 would come after 5 s: past this wait
    assert status == 413 and shaped(payload), payload
    assert payload["error"]["code"] == "request_too_large" and "chunk" in payload["error"]["message"]


def test_a_sensible_chunked_body_is_still_served(served):
    _, server, _ = served
    content = b'{"model": "evoke", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]}'
    chunked = f"{len(content):X}\r\n".encode() + content + b"\r\n0\r\n\r\n"
    headers = ["Host: 127.0.0.1", "Content-Type: application/json", "Transfer-Encoding: chunked", "Connection: close"]
    status, payload, _ = raw(server, request("/v1/chat/completions", headers, chunked), wait_s=60.0)
    assert status == 200 and payload["choices"][0]["message"]["role"] == "assistant", payload
