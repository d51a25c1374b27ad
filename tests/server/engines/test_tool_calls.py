"""Tool calls: OpenAI messages and tools to template-ready messages, generated text to tool_calls."""

from __future__ import annotations

import json
import re

import jinja2
import pytest

from art_backend.engines._tool_calls import (
    format_tool_call_text,
    parse_tool_calls,
    prepare_messages,
    render_tools_system_prompt,
    template_supports_tools,
)
from art_backend.testing import InvalidRequestError
from tests.support.chat_messages import assistant_tool_calls, tool_result
from tests.support.tiny_model import CHATML_TEMPLATE

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
TOOL_NAMES = {"get_weather", "get_time"}

CONVERSATION_WITH_CALLS = [
    {"role": "user", "content": "Weather and time in Paris?"},
    assistant_tool_calls(
        ("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "Europe/Paris"}')
    ),
    tool_result("call_1", '{"temperature": 21}'),
    tool_result("call_2", "14:05"),
]


def render_chatml(messages: list[dict]) -> str:
    return jinja2.Template(CHATML_TEMPLATE).render(messages=messages, add_generation_prompt=True)


def call_summary(tool_calls: list[dict]) -> list[tuple[str, dict]]:
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"])) for call in tool_calls
    ]


# template_supports_tools


@pytest.mark.parametrize(
    ("chat_template", "expected"),
    [
        (CHATML_TEMPLATE, False),
        (None, False),
        ("{% if tools %}{% for tool in tools %}{{ tool | tojson }}{% endfor %}{% endif %}", True),
        ("{%- if tools is defined and tools %}...{% endif %}", True),
        ("{{ message['toolset'] }}", False),
    ],
)
def test_template_supports_tools_when_template_references_tools(chat_template, expected):
    assert template_supports_tools(chat_template) is expected


# render_tools_system_prompt


def test_tools_prompt_contains_each_tool_name_and_schema():
    prompt = render_tools_system_prompt(TOOLS)
    for tool in TOOLS:
        assert tool["function"]["name"] in prompt
        assert json.dumps(tool, ensure_ascii=False) in prompt


def test_tools_prompt_lists_tools_inside_tools_tags_and_shows_the_call_format():
    prompt = render_tools_system_prompt(TOOLS)
    tools_section = re.search(r"<tools>\n(.*)\n</tools>", prompt, re.DOTALL)
    assert tools_section is not None
    assert [json.loads(line) for line in tools_section.group(1).splitlines()] == TOOLS
    assert (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        in prompt
    )


# format_tool_call_text


@pytest.mark.parametrize(
    ("arguments", "expected_arguments_json"),
    [
        ({"city": "Paris"}, '{"city": "Paris"}'),
        ('{"city": "Paris"}', '{"city": "Paris"}'),
        ("not json", '"not json"'),
        ({"city": "Zürich"}, '{"city": "Zürich"}'),
    ],
)
def test_format_tool_call_text_is_one_hermes_block(arguments, expected_arguments_json):
    assert format_tool_call_text("get_weather", arguments) == (
        '<tool_call>\n{"name": "get_weather", "arguments": '
        + expected_arguments_json
        + "}\n</tool_call>"
    )


# prepare_messages without template tool support


def test_tools_prompt_is_appended_to_the_first_system_message():
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
    ]
    prepared = prepare_messages(messages, TOOLS, supports_tools=False)
    assert prepared[0] == {
        "role": "system",
        "content": "You are terse.\n\n" + render_tools_system_prompt(TOOLS),
    }
    assert prepared[1:] == [{"role": "user", "content": "Hi"}]


def test_tools_prompt_becomes_a_new_system_message_when_there_is_none():
    prepared = prepare_messages([{"role": "user", "content": "Hi"}], TOOLS, supports_tools=False)
    assert prepared == [
        {"role": "system", "content": render_tools_system_prompt(TOOLS)},
        {"role": "user", "content": "Hi"},
    ]


@pytest.mark.parametrize("tools", [None, []])
def test_no_tools_means_no_tools_prompt(tools):
    messages = [{"role": "user", "content": "Hi"}]
    assert prepare_messages(messages, tools, supports_tools=False) == messages


def test_developer_message_becomes_system():
    prepared = prepare_messages(
        [{"role": "developer", "content": "Be brief."}], None, supports_tools=False
    )
    assert prepared == [{"role": "system", "content": "Be brief."}]


def test_developer_message_receives_the_tools_prompt():
    prepared = prepare_messages(
        [{"role": "developer", "content": "Be brief."}], TOOLS, supports_tools=False
    )
    assert prepared[0]["role"] == "system"
    assert prepared[0]["content"].startswith("Be brief.\n\n# Tools")


def test_text_parts_are_joined_with_newlines():
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "First."}, {"type": "text", "text": "Second."}],
        }
    ]
    prepared = prepare_messages(messages, None, supports_tools=False)
    assert prepared == [{"role": "user", "content": "First.\nSecond."}]


def test_none_content_becomes_empty_string():
    prepared = prepare_messages(
        [{"role": "assistant", "content": None}], None, supports_tools=False
    )
    assert prepared == [{"role": "assistant", "content": ""}]


def test_assistant_tool_calls_become_tool_call_blocks_after_its_text():
    messages = [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": CONVERSATION_WITH_CALLS[1]["tool_calls"],
        }
    ]
    prepared = prepare_messages(messages, None, supports_tools=False)
    assert prepared == [
        {
            "role": "assistant",
            "content": "Checking.\n"
            + format_tool_call_text("get_weather", {"city": "Paris"})
            + "\n"
            + format_tool_call_text("get_time", {"zone": "Europe/Paris"}),
        }
    ]


def test_assistant_tool_call_with_invalid_json_arguments_keeps_them_as_a_string():
    messages = [assistant_tool_calls(("get_weather", "{city: Paris"))]
    prepared = prepare_messages(messages, None, supports_tools=False)
    assert prepared[0]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": "{city: Paris"}\n</tool_call>'
    )


def test_consecutive_tool_messages_merge_into_one_user_turn():
    prepared = prepare_messages(CONVERSATION_WITH_CALLS, None, supports_tools=False)
    assert prepared[-1] == {
        "role": "user",
        "content": "<tool_response>\n"
        '{"temperature": 21}\n'
        "</tool_response>\n"
        "<tool_response>\n"
        "14:05\n"
        "</tool_response>",
    }
    assert len(prepared) == 3


def test_tool_messages_separated_by_another_turn_stay_separate():
    messages = [
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
        {"role": "user", "content": "and?"},
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
    ]
    prepared = prepare_messages(messages, None, supports_tools=False)
    assert [message["role"] for message in prepared] == ["user", "user", "user"]
    assert prepared[2]["content"] == "<tool_response>\nb\n</tool_response>"


def test_prepared_messages_render_with_a_plain_chatml_template():
    prepared = prepare_messages(
        [{"role": "system", "content": "Be brief."}, *CONVERSATION_WITH_CALLS],
        TOOLS,
        supports_tools=False,
    )
    rendered = render_chatml(prepared)
    assert rendered.count("<|im_start|>") == 5  # system, user, assistant, user, generation prompt
    assert "<tools>" in rendered
    assert '"name": "get_time"' in rendered
    assert "<tool_response>\n14:05\n</tool_response>" in rendered


# prepare_messages with template tool support


def test_supported_tools_keep_the_openai_shape_with_parsed_arguments():
    prepared = prepare_messages(CONVERSATION_WITH_CALLS, TOOLS, supports_tools=True)
    assert prepared == [
        {"role": "user", "content": "Weather and time in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": {"zone": "Europe/Paris"}},
                },
            ],
        },
        {"role": "tool", "content": '{"temperature": 21}', "tool_call_id": "call_1"},
        {"role": "tool", "content": "14:05", "tool_call_id": "call_2"},
    ]


def test_supported_tools_do_not_inject_the_tools_prompt():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert prepare_messages(messages, TOOLS, supports_tools=True) == messages


def test_supported_tools_still_turn_developer_into_system_and_join_parts():
    messages = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        }
    ]
    assert prepare_messages(messages, TOOLS, supports_tools=True) == [
        {"role": "system", "content": "A\nB"}
    ]


# prepare_messages rejects non-text content


@pytest.mark.parametrize("supports_tools", [False, True])
@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_non_text_part_is_rejected_naming_the_param(part, supports_tools):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]},
    ]
    with pytest.raises(InvalidRequestError) as error:
        prepare_messages(messages, None, supports_tools=supports_tools)
    assert error.value.param == "messages[1].content"
    assert "only text parts" in error.value.message
    assert part["type"] in error.value.message


# parse_tool_calls


def test_plain_text_has_no_tool_calls():
    assert parse_tool_calls("The weather is fine.", TOOL_NAMES) == ("The weather is fine.", [])


def test_single_hermes_call_is_parsed_into_an_openai_tool_call():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert content is None
    assert len(tool_calls) == 1
    call = tool_calls[0]
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call["id"])
    assert call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_parallel_hermes_calls_are_all_parsed_and_surrounding_text_is_content():
    text = (
        "Let me check both.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>'
    )
    content, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert content == "Let me check both."
    assert call_summary(tool_calls) == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "Europe/Paris"}),
    ]
    assert tool_calls[0]["id"] != tool_calls[1]["id"]


def test_hermes_call_without_closing_tag_at_the_end_is_parsed():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    content, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert content is None
    assert call_summary(tool_calls) == [("get_weather", {"city": "Paris"})]


def test_hermes_call_cut_off_mid_json_stays_content():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    assert parse_tool_calls(text, TOOL_NAMES) == (text, [])


WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"ci', None, []),
        (f'{WEATHER_CALL}\n{TIME_CALL}\n<tool_call>\n{{"name": "get_w', None, ["get_weather", "get_time"]),
        (f"Checking.\n{WEATHER_CALL}\n<tool_c", "Checking.", ["get_weather"]),
        (f"{WEATHER_CALL}\n<", None, ["get_weather"]),
        (f"{WEATHER_CALL}\n{TIME_CALL[:-3]}", None, ["get_weather", "get_time"]),  # `</tool_ca`
        ("The weather is fine.", "The weather is fine.", []),  # plain text is kept as it is
    ],
)  # fmt: skip
def test_a_call_cut_by_the_token_limit_is_dropped_and_complete_calls_keep_their_order(
    text: str, content: str | None, calls: list[str]
):
    parsed_content, tool_calls = parse_tool_calls(text, TOOL_NAMES, cut=True)
    assert parsed_content == content
    assert [call["function"]["name"] for call in tool_calls] == calls
    assert "<tool" not in (parsed_content or "")


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        ("1e999", "1e999"),
        ("-1E+400", "-1E+400"),
        ("NaN", "NaN"),
        ("-Infinity", "-Infinity"),
        ("1" * 5000, "1" * 5000),  # past Python's int digits limit: a ValueError before
        ("2.5", 2.5),
        ("12", 12),
    ],
)
def test_numbers_past_a_double_s_range_stay_the_text_the_model_wrote(written: str, kept):
    text = (
        f'<tool_call>\n{{"name": "get_weather", "arguments": {{"days": {written}}}}}\n</tool_call>'
    )
    _, [call] = parse_tool_calls(text, TOOL_NAMES)

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    # Strict JSON, as httpx sends it back (allow_nan=False) and as JavaScript parses it.
    arguments = json.loads(call["function"]["arguments"], parse_constant=refuse)
    assert arguments == {"days": kept}
    json.dumps(arguments, allow_nan=False)


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '```JSON\n{"name": "get_weather", "arguments": {"city": "Paris"}}```',
    ],
)
def test_fenced_json_call_is_parsed(text):
    content, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert content is None
    assert call_summary(tool_calls) == [("get_weather", {"city": "Paris"})]


def test_text_around_a_fenced_call_stays_content():
    text = (
        'Sure:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nOne moment.'
    )
    content, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert content == "Sure:\n\nOne moment."
    assert call_summary(tool_calls) == [("get_weather", {"city": "Paris"})]


def test_bare_json_object_is_a_call():
    text = ' {"name": "get_time", "arguments": {"zone": "UTC"}} \n'
    content, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert content is None
    assert call_summary(tool_calls) == [("get_time", {"zone": "UTC"})]


def test_bare_json_list_gives_parallel_calls():
    text = json.dumps(
        [
            {"name": "get_weather", "arguments": {"city": "Paris"}},
            {"name": "get_time", "arguments": {"zone": "UTC"}},
        ]
    )
    content, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert content is None
    assert call_summary(tool_calls) == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "UTC"}),
    ]


def test_bare_json_list_with_one_non_call_stays_content():
    text = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}, {"answer": 42}])
    assert parse_tool_calls(text, TOOL_NAMES) == (text, [])


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "send_email", "arguments": {"to": "a@b.c"}}',
        '```json\n{"name": "send_email", "arguments": {"to": "a@b.c"}}\n```',
        '<tool_call>\n{"name": "send_email", "arguments": {"to": "a@b.c"}}\n</tool_call>',
    ],
)
def test_unknown_tool_names_stay_content(text):
    assert parse_tool_calls(text, TOOL_NAMES) == (text, [])


def test_any_name_is_a_call_when_tool_names_are_not_given():
    text = '{"name": "send_email", "arguments": {"to": "a@b.c"}}'
    content, tool_calls = parse_tool_calls(text, None)
    assert content is None
    assert call_summary(tool_calls) == [("send_email", {"to": "a@b.c"})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>',
        '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"name": 7, "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": "{city"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',
        "<tool_call>\n\n</tool_call>",
        '```json\n{"name": "get_weather", "arguments": \n```',
        '{"name": "get_weather", "arguments": {"city": "Paris"}',
        '[{"name": "get_weather"',
        "```json\n{}\n```",
        "[]",
        "null",
        "42",
        "</tool_call>",
        "<tool_call>",
    ],
)
def test_broken_tool_calls_stay_content_without_raising(text):
    assert parse_tool_calls(text, TOOL_NAMES) == (text, [])


def test_a_broken_block_stays_content_while_a_valid_one_is_parsed():
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {city}}\n</tool_call>'
    valid = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    content, tool_calls = parse_tool_calls(f"{broken}\n{valid}", TOOL_NAMES)
    assert content == broken
    assert call_summary(tool_calls) == [("get_time", {"zone": "UTC"})]


def test_json_answer_with_a_name_field_but_no_arguments_is_not_a_call():
    text = '{"name": "get_weather", "population": 2100000}'
    assert parse_tool_calls(text, None) == (text, [])


def test_tagged_call_without_arguments_means_no_arguments():
    content, tool_calls = parse_tool_calls(
        '<tool_call>\n{"name": "get_time"}\n</tool_call>', TOOL_NAMES
    )
    assert content is None
    assert call_summary(tool_calls) == [("get_time", {})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n</tool_call>',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    ],
)
def test_parameters_is_accepted_as_an_alias_of_arguments(text):
    _, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert call_summary(tool_calls) == [("get_weather", {"city": "Paris"})]


def test_arguments_given_as_a_json_string_are_accepted():
    text = '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>'
    _, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert tool_calls[0]["function"]["arguments"] == '{"city": "Paris"}'


def test_arguments_are_serialized_without_ascii_escapes():
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Z\\u00fcrich"}}\n</tool_call>'
    )
    _, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert tool_calls[0]["function"]["arguments"] == '{"city": "Zürich"}'


def test_tagged_call_wrapped_in_a_fence_is_parsed():
    text = '<tool_call>\n```json\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n```\n</tool_call>'
    _, tool_calls = parse_tool_calls(text, TOOL_NAMES)
    assert call_summary(tool_calls) == [("get_time", {"zone": "UTC"})]


# round trip


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
        ("get_weather", {"city": "Zürich", "units": ["C", "F"], "detail": {"hourly": True}}),
        ("get_weather", '{"city": "Paris"}'),
    ],
)
def test_format_then_parse_gives_back_name_and_arguments(name, arguments):
    content, tool_calls = parse_tool_calls(format_tool_call_text(name, arguments), TOOL_NAMES)
    expected_arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert content is None
    assert call_summary(tool_calls) == [(name, expected_arguments)]


def test_prepared_assistant_turn_parses_back_to_its_tool_calls():
    prepared = prepare_messages(CONVERSATION_WITH_CALLS, None, supports_tools=False)
    content, tool_calls = parse_tool_calls(prepared[1]["content"], TOOL_NAMES)
    assert content is None
    assert call_summary(tool_calls) == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "Europe/Paris"}),
    ]


@pytest.mark.parametrize(
    "arguments",
    ["[" * 1100 + "]" * 1100, '{"n": ' + "9" * 4400 + "}", "[" * 200 + "]" * 200, "{not json"],
    ids=["too-deep-to-parse", "4400-digits", "deeper-than-the-body-limit", "invalid"],
)
def test_arguments_that_do_not_parse_or_nest_too_deep_are_kept_as_their_text(arguments: str):
    """Each of these was a 500 (RecursionError, ValueError) before it reached the template."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    [_, assistant] = prepare_messages(messages, None, supports_tools=True)
    assert assistant["tool_calls"][0]["function"]["arguments"] == arguments


def test_arguments_that_parse_become_the_value():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1]}'}}
    messages = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    [assistant] = prepare_messages(messages, None, supports_tools=True)
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"a": [1]}
