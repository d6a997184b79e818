"""Chat-template render-and-diff: per-message segments concatenate to the full rendering."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError

from evoke_engine.runtime.template import CHATML, ChatTemplate

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]


def test_segments_concatenate_to_the_whole():
    template = ChatTemplate(CHATML)
    pieces = [template.segment(MESSAGES[:i], MESSAGES[i]) for i in range(len(MESSAGES))]
    assert "".join(pieces) == template.render(MESSAGES)
    assert pieces[1] == "<|im_start|>user\nHi<|im_end|>\n"


def test_assistant_frame():
    frame = ChatTemplate(CHATML).assistant_frame(MESSAGES)
    assert frame.opening == "<|im_start|>assistant\n"
    assert frame.closing == "<|im_end|>\n"


def test_templates_run_sandboxed():
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(SecurityError):
        evil.render(MESSAGES)
