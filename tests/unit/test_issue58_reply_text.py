"""Issue 58 item 1 on plain objects: which decoded tokens a reply keeps once a stop string cut its text
(`tokens_before_stop`), and that the chat turn's `ReplyText` hands out no part of a stop spanning tokens."""

from __future__ import annotations

from evoke_engine.runtime.reply_text import ReplyText, tokens_before_stop

PIECES = {1: b"1. 1", 2: b"\n", 3: b"2", 4: b". 2", 5: b"\n3", 6: b". 3", 7: "é".encode()[:1], 8: "é".encode()[1:]}


def token_bytes(token: int) -> bytes:
    return PIECES[token]


def replay(tokens: list[int], stops: list[str]) -> tuple[str, str, bool]:
    """(text handed out, the text `ReplyText` holds, stopped) after adding `tokens` until a stop."""
    reply, out = ReplyText(token_bytes, stops), ""
    for token in tokens:
        piece, stop = reply.add(token)
        out += piece
        if stop:
            return out, reply.text, True
    out += reply.finish()
    return out, reply.text, False


def test_a_stop_of_several_tokens_is_never_handed_out():
    out, text, stopped = replay([1, 2, 3, 4, 5, 6], ["\n3. 3"])
    assert stopped and out == text == "1. 1\n2. 2"
    out, text, stopped = replay([1, 2, 3, 4, 5, 6], ["2\n3"])
    assert stopped and out == text == "1. 1\n2. "


def test_the_tokens_kept_hold_only_text_before_the_stop():
    # "\n3. 3" began in token 5 ("\n3"): tokens 1-4 are the text, nothing else to decode
    assert tokens_before_stop(token_bytes, [1, 2, 3, 4, 5], "1. 1\n2. 2") == (4, "")
    # "2\n3" began inside token 4 (". 2"): tokens 1-3 kept, ". " decoded in place of token 4
    assert tokens_before_stop(token_bytes, [1, 2, 3, 4], "1. 1\n2. ") == (3, ". ")
    assert tokens_before_stop(token_bytes, [1], "") == (0, "")
    assert tokens_before_stop(token_bytes, [], "") == (0, "")


def test_a_character_split_across_tokens_is_not_kept_half():
    # the first byte of "é" decodes to U+FFFD: that token does not hold text of the reply, so it is taken back
    assert tokens_before_stop(token_bytes, [1, 7], "1. 1") == (1, "")
    assert tokens_before_stop(token_bytes, [1, 7, 8], "1. 1é") == (3, "")
