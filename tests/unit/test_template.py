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


# -- a long conversation renders a turn from its last messages where the template allows (issue 44) --------------
NUMBERED = ("{% for m in messages %}[{{ loop.index }}] {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
# looks at the message before (a reply that follows a tool result is marked): local, it keeps a turn together
LOOKS_BACK = ("{% for m in messages %}{% if m['role'] == 'assistant' and loop.index0 > 0 and "
              "messages[loop.index0 - 1]['role'] == 'tool' %}(after tool) {% endif %}"
              "<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
              "{% if add_generation_prompt %}<assistant>{% endif %}")


def _day(turns: int, system: bool = True, tool_steps: int = 0) -> list[dict]:
    history = [{"role": "system", "content": "Be brief."}] if system else []
    for i in range(turns):
        history.append({"role": "user", "content": f"question {i}:\n  why does step {i} wait?"})
        for k in range(tool_steps if i == turns - 1 else 0):
            history += [{"role": "assistant", "content": f"calling tool {k}"}, {"role": "tool", "content": f"out {k}"}]
        history.append({"role": "assistant", "content": f"because of lock {i}"})
    return history


@pytest.mark.parametrize("source", [CHATML, LOOKS_BACK])
@pytest.mark.parametrize("system", [True, False])
def test_a_local_template_renders_a_long_conversation_from_its_last_messages_alike(source, system):
    template = ChatTemplate(source)
    history = _day(200, system=system, tool_steps=3)
    assert template.local
    assert len(template.window(history)) <= 1 + 3 * 2 + 2                     # the head and the last turn, whole
    window = template.window(history)
    assert window[int(system)]["role"] == "user" and window[-1] is history[-1]
    message = {"role": "user", "content": "and step 7?"}
    assert template.segment(history, message) == template._segment(history, message)          # whole render's
    assert template.assistant_frame([*history, message]) == template._frame([*history, message])
    pieces = [template.segment(history[:i], history[i]) for i in range(len(history))]
    assert "".join(pieces) == template.render(history)


def test_a_template_that_numbers_messages_renders_the_whole_history():
    template = ChatTemplate(NUMBERED)
    history = _day(30)
    assert not template.local and template.window(history) == history
    assert template.segment(history, {"role": "user", "content": "next"}) == "[62] user: next\n"


def test_a_template_that_refuses_a_probe_renders_the_whole_history():
    strict = ChatTemplate("{% for m in messages %}{% if loop.index0 > 8 %}{{ raise_exception('too long') }}"
                          "{% endif %}{{ m['content'] }}{% endfor %}")    # (a refused system message is polyfilled)
    assert not strict.local


def test_the_embedded_models_own_template_renders_a_long_conversation_from_its_last_messages_alike():
    from gguf import GGUFReader

    from evoke_engine.runtime.model_file import default_model_path

    field = GGUFReader(str(default_model_path())).fields["tokenizer.chat_template"]
    template = ChatTemplate(bytes(field.parts[field.data[0]]).decode())
    assert template.local
    for system in (True, False):
        history = _day(120, system=system)
        message = {"role": "user", "content": "and the retry budget?"}
        assert template.segment(history, message) == template._segment(history, message)
        assert template.assistant_frame(history) == template._frame(history)
        assert template.user_opening(history) == "<|im_start|>user\n"
