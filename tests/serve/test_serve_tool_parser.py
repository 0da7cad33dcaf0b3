"""Tool calls out of answer text (serve/api/tool_parser.py) and the constraints tools become (serve/api/tools.py),
without a model: every split of an answer into stream pieces gives the whole answer's calls and content."""
import json

import llguidance
import pytest

from tinystack.infer.chat import ChatFormatter
from tinystack.infer.chat_tools import HERMES, LLAMA3_JSON
from tinystack.serve.api.tool_parser import ToolCallParser, delta, finish_reason, message
from tinystack.serve.api.tools import calls_grammar, structural_tag

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": {"c": true}}}</tool_call>'
ANSWERS = [
    CALL,
    CALL + "\n" + CALL.replace("Paris", "Rome"),
    "Let me check. " + CALL + "\nDone.",
    "a < b and <tool is not a call",
    "plain text",
    '<tool_call>{"name": "f", "arguments": {"x": "}</tool_call"} }</tool_call>',
    '<tool_call>{"name": "f", "arguments": {"x": "a \\" { [ \\\\", "y": [1, {"z": null}]}}</tool_call> after',
    "<tool_call>not a call</tool_call> text",
]
# Llama 3.1's format: the call is the JSON object itself, "parameters" for the arguments, nothing around it
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": {"c": true}}}'
LLAMA_ANSWERS = [
    LLAMA_CALL,
    " " + LLAMA_CALL + "\n",
    '{"name": "f", "parameters": {"x": "} { \\" ]"}}',
    '{"city": "Paris"} is JSON but not a call',
    '{"name": "f", "arguments": {}} is not in this format',
    "plain text {with braces}",
]


def _whole(text: str, max_calls=None, fmt=HERMES) -> ToolCallParser:
    p = ToolCallParser(fmt, max_calls)
    p.feed(text)
    p.finish()
    return p


def _streamed(text: str, size: int, max_calls=None, fmt=HERMES) -> tuple[str, list[dict]]:
    """The answer fed `size` characters at a time, assembled from deltas as a client does."""
    p = ToolCallParser(fmt, max_calls)
    content, calls = "", []
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    for i, piece in enumerate(pieces):
        d = delta(p.feed(piece) + (p.finish() if i == len(pieces) - 1 else []))
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if tc["index"] == len(calls):
                calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
            calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    return content, calls


@pytest.mark.parametrize("fmt,text", [(HERMES, t) for t in ANSWERS] + [(LLAMA3_JSON, t) for t in LLAMA_ANSWERS])
def test_stream_pieces_add_up_to_the_whole_answer(fmt, text):
    whole = _whole(text, fmt=fmt)
    if fmt is HERMES and "not a call" not in text:
        assert "<tool_call>" not in whole.content and "</tool_call>" not in whole.content
    for size in (1, 2, 3, 7, len(text)):
        content, calls = _streamed(text, size, fmt=fmt)
        assert content == whole.content
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in whole.calls]


def test_calls_are_parsed_with_their_arguments_as_json_text():
    p = _whole("Let me check. " + CALL + "\n" + CALL.replace("Paris", "Rome") + "\n")
    assert [json.loads(c["function"]["arguments"]) for c in p.calls] == \
        [{"city": "Paris", "unit": {"c": True}}, {"city": "Rome", "unit": {"c": True}}]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in p.calls)
    assert len({c["id"] for c in p.calls}) == 2
    assert p.content == "Let me check."  # whitespace before a call is no content
    assert finish_reason(p, "stop") == "tool_calls" and finish_reason(p, "length") == "length"
    only_calls = message(_whole(CALL + "\n"))
    assert only_calls["content"] is None and len(only_calls["tool_calls"]) == 1
    assert message(_whole("hello")) == {"role": "assistant", "content": "hello"}
    assert finish_reason(_whole("hello"), "stop") == "stop"


def test_arguments_are_exactly_the_json_value_even_with_markup_and_braces_in_strings():
    p = _whole(ANSWERS[6])
    assert json.loads(p.calls[0]["function"]["arguments"]) == {"x": 'a " { [ \\', "y": [1, {"z": None}]}
    assert p.content == " after"  # text after a call keeps its own leading whitespace
    p = _whole(ANSWERS[7])  # markup around what is no call is given back as it was written
    assert p.calls == [] and p.content == "<tool_call>not a call</tool_call> text"


def test_llama3_json_calls_are_the_object_itself_with_parameters():
    p = _whole(" " + LLAMA_CALL + "\n", fmt=LLAMA3_JSON)
    assert p.content == "" and [c["function"]["name"] for c in p.calls] == ["get_weather"]
    assert json.loads(p.calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": {"c": True}}
    assert message(p)["content"] is None and finish_reason(p, "stop") == "tool_calls"
    for text in LLAMA_ANSWERS[3:]:  # JSON that is not a call, or another format's: content, as written
        p = _whole(text, fmt=LLAMA3_JSON)
        assert p.calls == [] and p.content == text.strip(), text
    cut = _whole('{"name": "get_weather", "parameters": {"city": "Pa', fmt=LLAMA3_JSON)
    assert cut.calls[0]["function"]["arguments"] == '{"city": "Pa' and cut.content == ""


def test_the_tool_format_is_read_off_the_template():
    llama = ("{% if tools %}Environment: ipython\nRespond in the format {\"name\": function name, \"parameters\": "
             "dictionary of argument name and its value}.{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
    qwen = ("{% if tools %}<tools>{{ tools | tojson }}</tools> call as <tool_call>{\"name\": ..., \"arguments\": ...}"
            "</tool_call>{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert ChatFormatter(llama).tool_format is LLAMA3_JSON
    assert ChatFormatter(qwen).tool_format is HERMES
    assert ChatFormatter("{% for m in messages %}{{ m.content }}{% endfor %}").tool_format is HERMES  # fallback
    assert ChatFormatter(None).tool_format is HERMES


def test_llama3_json_constraints_write_its_format_and_one_call():
    schemas = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    tag = structural_tag(schemas, LLAMA3_JSON)
    assert tag["triggers"] == ['{"name"']
    assert tag["structures"] == [{"begin": '{"name": "get_weather", "parameters": ', "schema": schemas["get_weather"],
                                  "end": "}"}]
    grammar = calls_grammar(schemas, False, LLAMA3_JSON)
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar)) == ""
    assert '"{\\"name\\": \\"get_weather\\", \\"parameters\\": "' in grammar


def test_max_calls_drops_the_calls_after_it():
    p = _whole(CALL + "\n" + CALL.replace("Paris", "Rome"), max_calls=1)
    assert len(p.calls) == 1 and "Paris" in p.calls[0]["function"]["arguments"] and p.content == ""


def test_a_call_cut_by_max_tokens_keeps_its_arguments_so_far():
    p = _whole('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa')
    assert p.calls[0]["function"]["arguments"] == '{"city": "Pa' and p.content == ""
    assert _whole('<tool_call>{"name": "get_w').calls == []  # no name yet: nothing to report
    assert _whole('<tool_call>{"name": "get_w').content == ""  # and no markup as content


def test_the_constraints_compile_and_accept_exactly_the_call_format():
    schemas = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
               "noop": {"type": "object", "properties": {}}}
    for grammar in (calls_grammar(schemas, many=True), calls_grammar(schemas, many=False)):
        assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar)) == ""
    many = calls_grammar(schemas, many=True)
    assert "start: call+" in many and "%json" in many
    tag = structural_tag(schemas)
    assert tag["triggers"] == ["<tool_call>"]
    assert [s["begin"] for s in tag["structures"]] == ['<tool_call>{"name": "get_weather", "arguments": ',
                                                       '<tool_call>{"name": "noop", "arguments": ']
    assert {s["end"] for s in tag["structures"]} == {"}</tool_call>"}


def test_a_template_without_tools_gets_the_fallback_format():
    fmt = ChatFormatter("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    assert not fmt.supports_tools
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = fmt.render(messages, tools=tools)
    assert text.startswith("<system># Tools") and '"name": "get_weather"' in text
    assert '<assistant><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<user><tool_response>\nsunny\n</tool_response>" in text


def test_a_template_with_tools_gets_them_as_apply_chat_template_passes_them():
    fmt = ChatFormatter("{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
                        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
                        "{{ c.function.arguments.city }}{% endfor %}{{ m.content }};{% endfor %}")
    assert fmt.supports_tools
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "cold"}]
    assert fmt.render(messages, tools=tools) == "[get_weather]Oslo;cold;"
