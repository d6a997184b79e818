"""Issue 60, the chat templates of real model families (tests/fixtures/chat_templates: Qwen2.5, Qwen3, Qwen3-Coder,
Llama 3.1, Mistral Nemo, DeepSeek V3.1, DeepSeek-R1-Distill, Gemma 2, Phi-3.5) render a conversation the way the
engine decodes it: the system prefix is shared by conversations, the text a live conversation decodes turn by turn
and the text a rebuild from its history decodes are the template's whole render of it, also for templates that
rewrite earlier messages when a later one arrives (the load-time check says which; `rerender` decodes those
messages again before the next turn). Plain objects: text in, text out, as the engine's turn and rebuild cut it."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoke_engine.conversations.rerender import checked_from, expected_segments, first_stale
from evoke_engine.runtime.template import ChatTemplate

pytestmark = pytest.mark.unit

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
DS_BOS, DS_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
# fixture: (bos, eos, stable, local)
FAMILIES = {
    "qwen2.5-instruct.jinja": ("", "<|im_end|>", False, True),          # closes a run of tool results after the last
    "qwen3.jinja": ("", "<|im_end|>", False, True),                     # drops an older reply's <think> block
    "qwen3-coder.jinja": ("", "<|im_end|>", False, True),
    "llama-3.1-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>", True, True),
    "mistral-nemo-instruct-2407.jinja": ("<s>", "</s>", False, False),   # the system prompt in the last user message
    "deepseek-v3.1.jinja": (DS_BOS, DS_EOS, True, True),
    "deepseek-r1-distill-qwen.jinja": (DS_BOS, DS_EOS, False, True),
    "gemma-2-it.jinja": ("<bos>", "<eos>", True, False),                # refuses a system message: put in the first
    "phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>", False, True),   # ends a render with EOS
}
THINKING = {"qwen3.jinja", "deepseek-r1-distill-qwen.jinja"}
SYSTEM = {"role": "system", "content": "You are a careful coding assistant."}


def template_of(fixture: str) -> ChatTemplate:
    bos, eos, *_ = FAMILIES[fixture]
    return ChatTemplate((TEMPLATES / fixture).read_text(encoding="utf-8"), bos_token=bos, eos_token=eos)


def exchanges(fixture: str, n: int = 4) -> list[tuple[str, str]]:
    """(user text, the reply as the model writes it) for `n` turns; reasoning models think first."""
    turns = []
    for i in range(n):
        reply = f"Use a lock around step {i}.\n\n```python\nwith lock:\n    step({i})\n```"
        if fixture in THINKING:
            reply = f"<think>\nThe user asks about step {i}.\n</think>\n\n{reply}"
        turns.append((f"Why does step {i} hang?\n  (it waits on {{io}})", reply))
    return turns


class Conversation:
    """What the engine decodes for one conversation, message by message, as text: the shared prefix, each input's
    segment, each reply's frame around its text (`turn.run_turn`, `turn.replay_*`), settled before each turn the
    way `rerender.settle` settles the KV."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.prefix = template.segment([], SYSTEM)
        self.history: list[dict] = []
        self.decoded: list[str] = []            # per history message
        self.settled_before = False             # a new memory: its first settle checks every message

    def settle(self, upcoming: dict) -> int:
        """Decode again (here: cut again) the messages the render after `upcoming` gives other text; how many."""
        if self.template.stable:
            return 0
        first, segments = expected_segments(self.template, SYSTEM, self.history, upcoming,
                                            settled_before=self.settled_before)
        self.settled_before = True
        stale = first_stale(self.decoded[first:], [s.text for s in segments])
        if stale is None:
            return 0
        self.decoded[first + stale:] = [s.text for s in segments[stale:]]
        return len(segments) - stale

    def turn(self, text: str, reply: str) -> None:
        message = {"role": "user", "content": text}
        self.settle(message)
        self.decoded.append(self.template.message_segment([SYSTEM, *self.history], message).text)
        frame = self.template.assistant_frame([SYSTEM, *self.history, message])
        self.decoded.append(frame.opening + reply + frame.closing)
        self.history += [message, {"role": "assistant", "content": reply}]

    def prompt(self, text: str) -> str:
        """What the model reads before its reply to `text`: the prefix, the settled history, the input, the opening."""
        message = {"role": "user", "content": text}
        self.settle(message)
        segment = self.template.message_segment([SYSTEM, *self.history], message).text
        opening = self.template.assistant_frame([SYSTEM, *self.history, message]).opening
        return self.prefix + "".join(self.decoded) + segment + opening

    @classmethod
    def rebuilt(cls, template: ChatTemplate, history: list[dict]) -> Conversation:
        """A conversation decoded again from its history (`lifecycle`'s rebuild: `replay_input`, `replay_reply`)."""
        conv = cls(template)
        for message in history:
            before = [SYSTEM, *conv.history]
            if message["role"] == "assistant":
                frame = template.assistant_frame(before)
                conv.decoded.append(frame.opening + message["content"] + frame.closing)
            else:
                conv.decoded.append(template.message_segment(before, message).text)
            conv.history.append(message)
        return conv


@pytest.mark.parametrize("fixture", list(FAMILIES))
def test_the_load_time_check_says_which_templates_rewrite_earlier_messages(fixture):
    _, _, stable, local = FAMILIES[fixture]
    template = template_of(fixture)
    assert (template.stable, template.local) == (stable, local)
    assert ("rewrites earlier messages" in template.rendering) == (not stable)


@pytest.mark.parametrize("fixture", list(FAMILIES))
def test_a_live_conversation_reads_the_whole_render(fixture):
    template = template_of(fixture)
    conv = Conversation(template)
    for text, reply in exchanges(fixture):
        conv.turn(text, reply)
        assert conv.prompt("next?") == template.render([SYSTEM, *conv.history, {"role": "user", "content": "next?"}],
                                                       add_generation_prompt=True)


@pytest.mark.parametrize("fixture", list(FAMILIES))
def test_a_rebuild_from_history_decodes_what_the_live_conversation_holds(fixture):
    template = template_of(fixture)
    live = Conversation(template)
    for text, reply in exchanges(fixture):
        live.turn(text, reply)
    rebuilt = Conversation.rebuilt(template, live.history)
    assert rebuilt.prompt("and now?") == live.prompt("and now?")
    assert rebuilt.decoded == live.decoded


@pytest.mark.parametrize("fixture", list(FAMILIES))
def test_conversations_share_the_system_prefix(fixture):
    template = template_of(fixture)
    first, second = Conversation(template), Conversation(template)
    first.turn("What does this regex match?", "Digits.")
    second.turn("Write a test for parse().", "def test_parse(): ...")
    assert first.prefix == second.prefix
    for conv in (first, second):
        whole = template.render([SYSTEM, *conv.history])
        assert whole.startswith(conv.prefix)
    if fixture not in ("mistral-nemo-instruct-2407.jinja", "gemma-2-it.jinja"):
        assert SYSTEM["content"] in first.prefix       # Mistral and Gemma put it in a user message: not shareable


def test_only_what_the_template_rewrites_is_decoded_again():
    qwen3 = Conversation(template_of("qwen3.jinja"))
    for text, reply in exchanges("qwen3.jinja", 3):
        qwen3.turn(text, reply)
    upcoming = {"role": "user", "content": "next?"}
    first, segments = expected_segments(qwen3.template, SYSTEM, qwen3.history, upcoming)
    assert first == checked_from(qwen3.history) == 2                   # the turn before the last, on
    assert first_stale(qwen3.decoded[first:], [s.text for s in segments]) == 3      # the last reply only
    assert qwen3.settle(upcoming) == 1
    assert "<think>" not in qwen3.decoded[-1] and qwen3.decoded[-1].endswith("```<|im_end|>\n")
    assert qwen3.settle(upcoming) == 0
    stable = Conversation(template_of("llama-3.1-instruct.jinja"))
    stable.turn("hi", "hello")
    assert stable.settle(upcoming) == 0


def test_a_reply_segment_marks_its_content_and_only_its_markup_special():
    template = template_of("qwen3.jinja")
    conv = Conversation(template)
    text, reply = exchanges("qwen3.jinja", 1)[0]
    conv.turn(text, reply)
    _, segments = expected_segments(template, SYSTEM, conv.history, {"role": "user", "content": "next?"})
    user, answer = segments
    assert [t for t, special in user.parts() if not special] == [text]
    assert [t for t, special in answer.parts() if special] == ["<|im_start|>assistant\n", "<|im_end|>\n"]
    assert [t for t, special in answer.parts() if not special] == [reply.split("</think>\n\n")[1]]


def test_tool_results_one_after_another_are_cut_as_the_whole_render_groups_them():
    template = template_of("qwen2.5-instruct.jinja")
    history = [SYSTEM, {"role": "user", "content": "weather in Paris and Rome?"},
               {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"},
               {"role": "tool", "content": "Paris: 21"}]
    second = {"role": "tool", "content": "Rome: 25"}
    segment = template.segment(history, second)
    assert segment == "\n<tool_response>\nRome: 25\n</tool_response><|im_end|>\n"
    settled = template.settled_segments([*history, second], start=3)
    assert settled[0].text.endswith("\n<tool_response>\nParis: 21\n</tool_response>")   # no <|im_end|> after it
    assert "".join(s.text for s in template.settled_segments([*history, second])) + segment \
        == template.render([*history, second], add_generation_prompt=True)[:-len("<|im_start|>assistant\n")]


def test_a_template_that_refuses_a_system_message_gets_it_in_the_first_user_message():
    template = template_of("gemma-2-it.jinja")
    text = template.render([SYSTEM, {"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == f"<bos><start_of_turn>user\n{SYSTEM['content']}\n\nhi<end_of_turn>\n<start_of_turn>model\n"


def test_the_date_a_template_writes_is_the_loads():
    template = ChatTemplate("{{ strftime_now('%d %b %Y %H:%M:%S.%f') }}")
    assert template.render([]) == template.render([])


# -- the engine's KV, on the simulated backend (tests/helpers/sim_backend.py: the real lifecycle, memory and turn) --
def test_the_engine_decodes_again_what_qwen3_rewrites_and_a_rebuild_gets_the_same_tokens(tmp_path):
    from helpers.sim_backend import SimBackend, sim_engine, sim_settings, slot_tokens

    from evoke_engine.conversations import rerender

    source = (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")

    class Qwen3Backend(SimBackend):
        def open(self, settings, emit):
            parts = super().open(settings, emit)
            parts.rt.meta = lambda key: source if key == "tokenizer.chat_template" else None
            return parts

    backend = Qwen3Backend(tmp_path / "sim.gguf")
    upcoming = {"role": "user", "content": "and the retry?"}
    with sim_engine(backend, sim_settings(tmp_path)) as (engine, _):
        template = engine.diagnostics().template
        assert not template.stable
        backend.script(*(reply for _, reply in exchanges("qwen3.jinja", 3)))
        conv = engine.new_conversation()
        for text, _ in exchanges("qwen3.jinja", 3):
            conv.send(text)

        def settled() -> tuple[int, str, str]:
            lifecycle = engine.lifecycle
            state = lifecycle.open(conv.id)
            lifecycle.ensure_slot(state)
            decoded = rerender.settle(lifecycle, state, upcoming)
            messages = [state.system_message, *state.history, upcoming]
            whole = template.render(messages, add_generation_prompt=True)
            tail = template.segment(messages[:-1], upcoming) + template.assistant_frame(messages).opening
            return decoded, whole[:-len(tail)], engine.diagnostics().rt.detokenize(slot_tokens(engine, conv.id))

        decoded, history_text, slot_text = engine.thread.call(settled)
        assert decoded > 0 and "<think>" not in history_text        # the last reply's thinking went (Qwen3 keeps
        assert slot_text == history_text                             # only the current turn's)
        live = slot_tokens(engine, conv.id)
        engine.release_conversation(conv.id, persist=False)          # no KV file: rebuilt from SQLite
        engine.wait_idle()
        engine.open_conversation(conv.id)
        decoded, history_text, slot_text = engine.thread.call(settled)
        assert slot_text == history_text and slot_tokens(engine, conv.id) == live
