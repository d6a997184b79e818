"""Issue 60, tool calls in the model's own format: the format is detected from the real chat templates of Qwen2.5
(Hermes), Llama 3.1 and Mistral Nemo (tests/fixtures/chat_templates), the calls those templates render are parsed
back (markers kept, and dropped as the engine's detokenizer drops control tokens), streamed in random pieces to the
same content, cut calls leave no markup, and the forcing grammar has each format's markup."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from evoke_engine.runtime.template import CHATML, ChatTemplate
from evoke_engine.server.constraints import _tool_call_grammar, grammar_for, prefixed_rules
from evoke_engine.server.request_bodies import ChatRequest
from evoke_engine.server.toolcall_formats import (
    FORMATS,
    HERMES,
    ParsedCall,
    format_named,
    format_of_template,
    json_cut_short,
    loaded_format,
)
from evoke_engine.server.toolcall_stream import CallReader
from evoke_engine.server.toolcalls import RawTextMap, drop_unfinished_call, parse_tool_calls

pytestmark = pytest.mark.unit      # the unit tier: no model loaded (make test-fast)

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
# (fixture, detected format, bos, eos, the end-of-turn text a reply's segment ends with)
FAMILIES = [("qwen2.5-instruct.jinja", "hermes", "", "<|im_end|>", "<|im_end|>\n"),
            ("llama-3.1-instruct.jinja", "llama3", "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"),
            ("mistral-nemo-instruct-2407.jinja", "mistral", "<s>", "</s>", "</s>")]
CONTROL_TOKENS = ("<|python_tag|>", "[TOOL_CALLS]", "[ARGS]")      # control tokens: reply text goes without them
TOOL_NAMES = {"get_weather", "grep"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city"]}}},
         {"type": "function", "function": {
             "name": "grep", "description": "Search files",
             "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}},
                            "required": ["pattern"]}}}]
WEATHER = ParsedCall("get_weather", json.dumps({"city": "Paris", "days": 2}, sort_keys=True))
GREP = ParsedCall("grep", json.dumps({"pattern": "TODO"}))


def template_of(fixture: str, bos: str = "", eos: str = "") -> ChatTemplate:
    return ChatTemplate((TEMPLATES / fixture).read_text(encoding="utf-8"), bos_token=bos, eos_token=eos)


# -- detection ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fixture", "expected"), [(f, name) for f, name, *_ in FAMILIES])
def test_the_format_is_detected_from_the_real_template(fixture, expected):
    assert format_of_template((TEMPLATES / fixture).read_text(encoding="utf-8")).name == expected


def test_detection_defaults_to_hermes_and_knows_the_newer_mistral_markup():
    assert format_of_template(None) is HERMES and format_of_template(CHATML) is HERMES
    assert format_of_template("{{ '[TOOL_CALLS]' + name + '[ARGS]' + args }}").name == "mistral_args"
    assert format_of_template("<|start_header_id|>ipython<|end_header_id|>").name == "llama3"     # Llama 3.2
    with pytest.raises(ValueError, match="hermes"):
        format_named("deepseek")


def test_the_loaded_models_format_comes_from_its_template():
    class Engine:
        def __init__(self, model) -> None:
            self.model = model

        def diagnostics(self):
            return self.model

    class Model:
        template = template_of("llama-3.1-instruct.jinja")
    assert loaded_format(Engine(Model())).name == "llama3"
    assert loaded_format(Engine(None)) is HERMES


# -- the templates' own markup, parsed back -------------------------------------------------------------------------
def conversation(call_id: str = "abcDEF123") -> tuple[list[dict], dict]:
    """A conversation up to the user's question, and the assistant message calling a tool (as templates take it)."""
    history = [{"role": "system", "content": "You are a coding assistant."},
               {"role": "user", "content": "What is the weather in Paris for two days?"}]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "get_weather",
                                                         "arguments": {"city": "Paris", "days": 2}}}]}
    return history, call


def rendered_reply(fixture: str, bos: str, eos: str, end: str) -> str:
    """The text of the tool-calling reply as the template writes it: where an assistant message's content would
    begin, to the end of the turn (Mistral Nemo moves the system prompt to the last user message, so the prompt
    alone is no prefix of the whole)."""
    template = template_of(fixture, bos, eos)
    history, call = conversation()
    whole = template.render([*history, call], tools=TOOLS)
    marked = template.render([*history, {"role": "assistant", "content": "\x00reply\x00"}], tools=TOOLS)
    prefix = marked[:marked.index("\x00reply\x00")]
    assert whole.startswith(prefix) and whole.endswith(end)
    return whole[len(prefix):-len(end)]


@pytest.mark.parametrize(("fixture", "name", "bos", "eos", "end"), FAMILIES)
def test_a_conversation_with_tools_renders_through_the_engines_template_code(fixture, name, bos, eos, end):
    template = template_of(fixture, bos, eos)
    history, call = conversation()
    result = {"role": "tool", "tool_call_id": "abcDEF123", "content": '{"temperature": 21}'}
    text = template.render([*history, call, result, {"role": "assistant", "content": "It is 21 degrees."}],
                           tools=TOOLS)
    assert "get_weather" in text and "Search files" in text and "It is 21 degrees." in text
    assert "temperature" in text          # Llama 3.1's template writes a string result as JSON: "{\"temp...


@pytest.mark.parametrize(("fixture", "name", "bos", "eos", "end"), FAMILIES)
def test_the_call_a_template_renders_is_parsed_back(fixture, name, bos, eos, end):
    fmt = format_named(name)
    reply = rendered_reply(fixture, bos, eos, end)
    assert parse_tool_calls(reply, TOOL_NAMES, fmt) == (None, [WEATHER])
    bare = reply
    for token in CONTROL_TOKENS:
        bare = bare.replace(token, "")
    assert parse_tool_calls(bare, TOOL_NAMES, fmt) == (None, [WEATHER])         # as the engine's text has it
    assert parse_tool_calls(reply, {"grep"}, fmt) == (reply, [])                 # an undeclared tool: text


# -- replies in each format -----------------------------------------------------------------------------------------
W = '{"city": "Paris", "days": 2}'
G = '{"pattern": "TODO"}'
# format -> [(reply, content, calls)]
REPLIES = {
    "hermes": [
        (f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>', None, [WEATHER]),
        (f'Let me look.\n<tool_call>\n{{"name": "grep", "arguments": {G}}}\n</tool_call>', "Let me look.", [GREP]),
        (f'<tool_call>{{"name": "get_weather", "arguments": {W}}}</tool_call>\n'
         f'<tool_call>{{"name": "grep", "arguments": {G}}}</tool_call>', None, [WEATHER, GREP]),
        (f'{{"name": "get_weather", "arguments": {W}}}', None, [WEATHER]),
    ],
    "llama3": [
        (f'{{"name": "get_weather", "parameters": {W}}}', None, [WEATHER]),
        (f'{{"type": "function", "name": "grep", "parameters": {G}}}', None, [GREP]),
        (f'<|python_tag|>{{"name": "get_weather", "parameters": {W}}}', None, [WEATHER]),
        (f'Let me look.<|python_tag|>{{"name": "grep", "parameters": {G}}}', "Let me look.", [GREP]),
        (f'{{"name": "get_weather", "parameters": {W}}}; {{"name": "grep", "parameters": {G}}}', None,
         [WEATHER, GREP]),
    ],
    "mistral": [
        (f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}, "id": "abcDEF123"}}]', None, [WEATHER]),
        (f'[{{"name": "get_weather", "arguments": {W}, "id": "abcDEF123"}}, {{"name": "grep", "arguments": {G}}}]',
         None, [WEATHER, GREP]),
        (f'Let me look.[TOOL_CALLS][{{"name": "grep", "arguments": {G}}}]', "Let me look.", [GREP]),
        (f'[TOOL_CALLS]get_weather[ARGS]{W}', None, [WEATHER]),
    ],
    "mistral_args": [
        (f'[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]grep[ARGS]{G}', None, [WEATHER, GREP]),
        (f'[TOOL_CALLS]grep[CALL_ID]a1b2c3d4e[ARGS]{G}', None, [GREP]),
        (f'get_weather{W}grep{G}', None, [WEATHER, GREP]),                      # [TOOL_CALLS] and [ARGS] dropped
        (f'Let me look.[TOOL_CALLS]grep[ARGS]{G}', "Let me look.", [GREP]),
    ],
}
PROSE = ["Plain prose, no call.", "Use `grep -r` here.", "a < b and [x] or {y}", "grep is a tool I know",
         '{"answer": 4}', "I would call get_weather{city} myself."]


@pytest.mark.parametrize(("name", "reply", "content", "calls"),
                         [(name, *case) for name, cases in REPLIES.items() for case in cases])
def test_a_finished_reply_is_parsed(name, reply, content, calls):
    assert parse_tool_calls(reply, TOOL_NAMES, format_named(name)) == (content, calls)


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("text", PROSE)
def test_prose_stays_text(name, text):
    assert parse_tool_calls(text, TOOL_NAMES, format_named(name)) == (text, [])
    assert drop_unfinished_call(text, format_named(name), TOOL_NAMES) == (text, False)


def test_a_malformed_call_keeps_the_reply_as_text():
    cases = [("llama3", '<|python_tag|>{"name": "get_weather", "parameters": "Paris"}'),
             ("mistral", '[TOOL_CALLS][{"name": "nope", "arguments": {}}]')]
    for name, text in cases:
        assert parse_tool_calls(text, TOOL_NAMES, format_named(name)) == (text, [])


def test_text_after_a_finished_call_is_content_not_a_reason_to_undo_it():
    """A call once read has been streamed: words after it are content beside it (they made the whole reply text
    before calls streamed)."""
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"} and more words'
    assert parse_tool_calls(text, TOOL_NAMES, format_named("mistral_args")) == (
        "and more words", [ParsedCall("get_weather", '{"city": "Paris"}')])


def streamed_content(reader: CallReader, text: str) -> str:
    """The content a stream sends for `text` fed a character at a time, its end's included."""
    deltas = [d for ch in text for d in reader.feed(ch)] + reader.close()
    return "".join(d.text for d in deltas if d.kind == "content")


def streamed(reply: str, fmt, rng: random.Random) -> tuple[str, str | None, list[ParsedCall]]:
    """(content as the endpoint streams it: the reader's content deltas, its end's included; the finished parse)
    for `reply` fed in random small pieces."""
    reader = CallReader(fmt, TOOL_NAMES)
    deltas, at = [], 0
    while at < len(reply):
        step = rng.randint(1, 4)
        deltas += reader.feed(reply[at:at + step])
        at += step
    deltas += reader.close()
    content, calls = parse_tool_calls(reply, TOOL_NAMES, fmt)
    return "".join(d.text for d in deltas if d.kind == "content"), content, calls


@pytest.mark.parametrize("name", list(FORMATS))
def test_streamed_in_random_pieces_the_content_is_the_finished_one(name):
    fmt, rng = format_named(name), random.Random(60)
    for reply, content, calls in REPLIES[name]:
        for _ in range(25):
            text, finished_content, finished_calls = streamed(reply, fmt, rng)
            assert (finished_content, finished_calls) == (content, calls)
            assert text.strip() == (content or "")
            assert not any(marker in text for marker in (*fmt.markers, "{", "[ARGS]"))
    for reply in PROSE:
        for _ in range(10):
            assert streamed(reply, fmt, rng)[0] == reply


@pytest.mark.parametrize(("name", "text", "before"), [
    ("llama3", '<|python_tag|>{"name": "get_wea', ""),
    ("llama3", "Let me look.<|python_tag|>", "Let me look."),
    ("llama3", "Let me look.<|python_ta", "Let me look."),
    ("llama3", '{"name": "get_weather", "parameters": {"ci', ""),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Pa', ""),
    ("mistral", "Let me look.[TOOL_CALLS]", "Let me look."),
    ("mistral", "Let me look.[TOOL_CA", "Let me look."),
    ("mistral", '[{"name": "get_weather", "argu', ""),
    ("mistral_args", "[TOOL_CALLS]get_wea", ""),
    ("mistral_args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', ""),
    ("mistral_args", 'get_weather{"city": "Pa', ""),
    ("hermes", '<tool_call>\n{"name": "get_wea', "")])
def test_a_cut_call_leaves_no_markup(name, text, before):
    fmt = format_named(name)
    assert drop_unfinished_call(text, fmt, TOOL_NAMES) == (before, True)
    assert parse_tool_calls(text, TOOL_NAMES, fmt) == (before, [])
    assert streamed_content(CallReader(fmt, TOOL_NAMES), text).rstrip() == before


def test_a_finished_call_then_a_cut_one_keeps_the_finished_one():
    cases = [("mistral_args", f'[TOOL_CALLS]grep[ARGS]{G}[TOOL_CALLS]get_weather[ARGS]{{"ci'),
             ("mistral_args", f'[TOOL_CALLS]grep[ARGS]{G}[TOOL_CA'),
             ("llama3", f'<|python_tag|>{{"name": "grep", "parameters": {G}}}<|python_t')]
    for name, text in cases:
        assert parse_tool_calls(text, TOOL_NAMES, format_named(name)) == (None, [GREP])


def test_json_cut_short():
    assert json_cut_short('{"a": [1, 2') and json_cut_short('{"a": "x}') and json_cut_short("[")
    assert not json_cut_short('{"a": 1}') and not json_cut_short('{"a": 1}}') and not json_cut_short("plain")


# -- rendering calls the model did not write ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FORMATS))
def test_rendered_calls_parse_back_in_their_format(name):
    fmt = format_named(name)
    text = fmt.render([WEATHER, GREP])
    assert parse_tool_calls(text, TOOL_NAMES, fmt) == (None, [WEATHER, GREP])
    assert RawTextMap(fmt=fmt).raw_text(None, [GREP], [None]) == fmt.render([GREP])
    assert RawTextMap(fmt=fmt).raw_text("Let me look.", [GREP], [None]) == "Let me look.\n" + fmt.render([GREP])


# -- forcing --------------------------------------------------------------------------------------------------------
def forced(name: str, tool_choice="required") -> str:
    return grammar_for(ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                   tool_choice=tool_choice), format_named(name))


def test_each_format_forces_its_own_markup():
    assert grammar_for(ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                   tool_choice="required")) == forced("hermes")          # Hermes stays the default
    assert re.search(r'^root ::= "<tool_call>" call "</tool_call>"$', forced("hermes"), re.M)
    assert re.search(r"^root ::= call$", forced("llama3"), re.M) and '"\\"parameters\\""' in forced("llama3")
    assert re.search(r'^root ::= "\[TOOL_CALLS\]" "\[" call "\]"$', forced("mistral"), re.M)
    named = forced("mistral_args", {"type": "function", "function": {"name": "grep"}})
    assert re.search(r'^root ::= "\[TOOL_CALLS\]" \( "grep\[ARGS\]" tool0-root \)$', named, re.M)
    both = forced("mistral_args")
    assert '"get_weather[ARGS]" tool0-root | "grep[ARGS]" tool1-root' in both
    defined = re.findall(r"^([A-Za-z0-9_-]+) ::=", both, re.M)
    assert len(defined) == len(set(defined))                    # each tool's rules renamed apart


def test_prefixed_rules_rename_definitions_and_uses_only():
    grammar = 'root ::= "root" item ( "," item )*\nitem ::= [a-z]+ "item"\n'
    assert prefixed_rules(grammar, "t-") == 't-root ::= "root" t-item ( "," t-item )*\nt-item ::= [a-z]+ "item"\n'


def test_the_forced_grammar_is_one_call_of_the_chosen_tool():
    for name in ("hermes", "llama3", "mistral"):
        fmt = format_named(name)
        grammar = _tool_call_grammar(TOOLS, ["grep"], fmt)
        assert '"\\"grep\\""' in grammar and "get_weather" not in grammar
