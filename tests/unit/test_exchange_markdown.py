"""The Markdown export on plain rows: a stopped reply's open code fence is closed, closed ones are left alone."""

from __future__ import annotations

import pytest

from evoke_engine.conversations.exchange import close_open_fences, to_markdown
from evoke_engine.store.history import ConversationRow, MessageRow

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-unit)


def _row(role: str, text: str, i: int) -> MessageRow:
    return MessageRow(id=i, conversation_id="c", role=role, text=text, attachments=[], created_at=0.0)


def test_a_stopped_replys_open_fence_is_closed_in_the_export():
    conversation = ConversationRow("c", "Lists", 0.0, 0.0, False, "", {})
    stopped = "Here:\n\n```python\nclass Node:\n    def __init__(self"
    markdown = to_markdown(conversation, [_row("user", "A linked list?", 1), _row("assistant", stopped, 2),
                                          _row("user", "Thanks", 3)])
    body = markdown.split("## Assistant", 1)[1].split("## User", 1)[0]
    assert body.count("```") == 2
    assert markdown.split("## User")[-1].strip() == "Thanks"


def test_closed_fences_and_longer_openers_are_respected():
    closed = "```\na\n```\nafter"
    assert close_open_fences(closed) == closed
    assert close_open_fences("````md\n```\ninner\n```\n") == "````md\n```\ninner\n```\n````"
    assert close_open_fences("~~~\nx") == "~~~\nx\n~~~"
    assert close_open_fences("no code") == "no code"
