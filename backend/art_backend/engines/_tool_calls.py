"""Tool calls: OpenAI `tools` and `tool_calls` in and out of a chat template's plain text.

Some chat templates render `tools` themselves (Qwen2.5, Hermes); others know nothing of them
(SmolLM2, plain ChatML). For the latter the backend writes the tools into the system prompt and
teaches the model the Hermes format below; for both, the generated text is parsed back into
OpenAI `tool_calls`.

Tool-call format (Hermes style)
-------------------------------
The system prompt lists each tool's OpenAI definition as one JSON line inside `<tools>` tags::

    <tools>
    {"type": "function", "function": {"name": "get_weather", "parameters": {...}}}
    </tools>

The model calls a tool by writing one block per call; several blocks in a row are parallel calls::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Earlier calls in the conversation are shown to the model in the same format, appended to the
assistant's text. Tool results come back as a `user` turn, one block per result (consecutive
`tool` messages merged into one turn, as Qwen2.5 does)::

    <tool_response>
    {"temperature": 21}
    </tool_response>

When parsing, the backend also accepts a fenced ```json block or a bare JSON object (or list of
objects) with `name` and `arguments` (alias `parameters`), as models often answer that way.
Anything that does not parse as a call for a known tool stays in the message content, with one
exception: when the generation stopped at the token limit (`cut`), an unfinished `<tool_call>`
block at the end of the text (or the start of its tag) is a call cut short and is dropped: no
client sees the markup, nor a call whose arguments do not parse. Its tokens stay in the answer's
token ids and usage, and the finish reason says `length`. (OpenAI's API returns such a call
with its arguments cut mid-JSON; Anthropic's an incomplete `tool_use`: neither can be run.)

Numbers the model writes past a double's range (`1e999`), integers past Python's 4,300 digits
and the constants `NaN`/`Infinity` are kept as the text the model wrote, a JSON string: a parsed `inf` would make the arguments
JSON that strict encoders refuse (`ValueError: Out of range float values are not JSON
compliant`, raised by httpx when a client sends the call back).
"""

from __future__ import annotations

import json
import math
import re
import secrets
import string
from typing import Any

from art_backend._errors import InvalidRequestError
from art_backend._limits import MAX_JSON_DEPTH, nests_deeper_than

_TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_CLOSE = "</tool_call>"
_FENCED_BLOCK = re.compile(r"```(?:json)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)
_CALL_ID_ALPHABET = string.ascii_letters + string.digits
_TEXT_PART_TYPES = {"text": "text", "refusal": "refusal"}  # part type -> key holding its text

_TOOLS_PROMPT_HEADER = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
"""

_TOOLS_PROMPT_FOOTER = """
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
To call several functions at once, write one <tool_call></tool_call> block per call."""


def template_supports_tools(chat_template: str | None) -> bool:
    """True when the Jinja chat template references `tools`, so it renders them itself."""
    return chat_template is not None and re.search(r"\btools\b", chat_template) is not None


def render_tools_system_prompt(tools: list[dict]) -> str:
    """The Hermes-style system prompt text listing `tools` and the `<tool_call>` format."""
    tool_lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return _TOOLS_PROMPT_HEADER + tool_lines + _TOOLS_PROMPT_FOOTER


def format_tool_call_text(name: str, arguments: dict | str) -> str:
    """The canonical `<tool_call>` block for one call; JSON-string arguments are embedded parsed."""
    call = {"name": name, "arguments": _parse_json_or_keep(arguments)}
    return f"{_TOOL_CALL_OPEN}\n{json.dumps(call, ensure_ascii=False)}\n{_TOOL_CALL_CLOSE}"


def prepare_messages(
    messages: list[dict], tools: list[dict] | None, *, supports_tools: bool
) -> list[dict]:
    """Turn OpenAI chat messages into dicts the chat template can render (see module docstring).

    With `supports_tools` the OpenAI/HF shape is kept (the caller passes `tools` to the template);
    without it, tools, calls and results are written as Hermes-style text.
    """
    prepared: list[dict] = []
    previous_role = None
    for index, message in enumerate(messages):
        role = "system" if message["role"] == "developer" else message["role"]
        content = _content_text(message.get("content"), index)
        if supports_tools:
            prepared.append(_native_message(message, role, content))
        elif role == "assistant" and message.get("tool_calls"):
            blocks = [
                format_tool_call_text(call["function"]["name"], call["function"]["arguments"])
                for call in message["tool_calls"]
            ]
            prepared.append({"role": "assistant", "content": "\n".join([content, *blocks]).strip()})
        elif role == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if previous_role == "tool":  # one user turn for a run of results, as Qwen2.5 does
                prepared[-1]["content"] += "\n" + response
            else:
                prepared.append({"role": "user", "content": response})
        else:
            prepared.append({"role": role, "content": content})
        previous_role = role

    if tools and not supports_tools:
        tools_prompt = render_tools_system_prompt(tools)
        if prepared and prepared[0]["role"] == "system":
            prepared[0]["content"] = f"{prepared[0]['content']}\n\n{tools_prompt}".lstrip()
        else:
            prepared.insert(0, {"role": "system", "content": tools_prompt})
    return prepared


def parse_tool_calls(
    text: str, tool_names: set[str] | None, *, cut: bool = False
) -> tuple[str | None, list[dict]]:
    """Split generated text into (content, OpenAI tool_calls); unrecognised calls stay content.

    `tool_names` (when given) limits which names count as calls; `cut` says the generation
    stopped at the token limit, so an unfinished last `<tool_call>` block is dropped (see the
    module docstring). Never raises.
    """
    calls: list[dict] = []
    remaining = _take_tagged_calls(text, tool_names, calls, cut=cut)
    remaining = _take_fenced_calls(remaining, tool_names, calls)
    if not calls:
        bare_calls = _as_tool_calls(_load_json(remaining.strip()), tool_names, tagged=False)
        if bare_calls:
            return None, bare_calls
        if remaining == text:  # nothing taken out: the text exactly as generated
            return text, []
    content = remaining.strip()
    return (content or None), calls


def _content_text(content: str | list | None, index: int) -> str:
    """A message's content as one string; list parts must all be text (joined with newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        part_type = part.get("type") if isinstance(part, dict) else type(part).__name__
        if part_type not in _TEXT_PART_TYPES:
            raise InvalidRequestError(
                f"messages[{index}].content has a part of type {part_type!r}; only text parts "
                '({"type": "text", "text": ...}) are supported by this server.',
                param=f"messages[{index}].content",
            )
        texts.append(str(part.get(_TEXT_PART_TYPES[part_type], "")))
    return "\n".join(texts)


def _native_message(message: dict, role: str, content: str) -> dict:
    """The OpenAI/HF message shape for templates that render tools: arguments parsed to dicts."""
    prepared: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant" and message.get("tool_calls"):
        prepared["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": _parse_json_or_keep(call["function"]["arguments"]),
                },
            }
            for call in message["tool_calls"]
        ]
    if role == "tool" and "tool_call_id" in message:
        prepared["tool_call_id"] = message["tool_call_id"]
    return prepared


def _parse_json_or_keep(arguments: dict | str) -> Any:
    """Arguments given as a JSON string become the parsed value; anything else is kept, as is a
    string that does not parse (invalid, an integer past 4,300 digits) or nests too deep for the
    chat template to render."""
    if not isinstance(arguments, str):
        return arguments
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return arguments
    return arguments if nests_deeper_than(value, MAX_JSON_DEPTH) else value


def _take_tagged_calls(
    text: str, tool_names: set[str] | None, calls: list[dict], *, cut: bool = False
) -> str:
    """Move each valid `<tool_call>` block into `calls`; return the text without those blocks
    (and, when the text was `cut`, without the unfinished block or tag it ends in)."""
    if cut:
        text = _without_cut_tag(text, _TOOL_CALL_OPEN)
    kept: list[str] = []
    position = 0
    while (start := text.find(_TOOL_CALL_OPEN, position)) != -1:
        body_start = start + len(_TOOL_CALL_OPEN)
        close = text.find(_TOOL_CALL_CLOSE, body_start)
        next_open = text.find(_TOOL_CALL_OPEN, body_start)
        if close != -1 and (next_open == -1 or close < next_open):
            body, end = text[body_start:close], close + len(_TOOL_CALL_CLOSE)
        elif next_open == -1:  # closing tag missing at the very end of the text
            body, end = text[body_start:], len(text)
            body = _without_cut_tag(body, _TOOL_CALL_CLOSE) if cut else body
        else:  # opened but never closed before the next block: leave it as content
            kept.append(text[position:next_open])
            position = next_open
            continue
        found = _as_tool_calls(_load_json(_strip_fence(body.strip())), tool_names, tagged=True)
        cut_short = cut and close == -1  # the limit ended the text inside this block
        kept.append(text[position:start] if found or cut_short else text[position:end])
        calls.extend(found)
        position = end
    kept.append(text[position:])
    return "".join(kept)


def _without_cut_tag(text: str, tag: str) -> str:
    """`text` without the start of `tag` the token limit cut at its end (`<tool_c`)."""
    for length in range(len(tag) - 1, 0, -1):
        if text.endswith(tag[:length]):
            return text[:-length]
    return text


def _take_fenced_calls(text: str, tool_names: set[str] | None, calls: list[dict]) -> str:
    """Move each fenced JSON block holding tool calls into `calls`; return the rest of the text."""

    def replace(match: re.Match[str]) -> str:
        found = _as_tool_calls(_load_json(match.group(1).strip()), tool_names, tagged=False)
        calls.extend(found)
        return "" if found else match.group(0)

    return _FENCED_BLOCK.sub(replace, text)


def _strip_fence(body: str) -> str:
    """A `<tool_call>` body wrapped in a ``` fence (some models do this) without the fence."""
    match = _FENCED_BLOCK.fullmatch(body)
    return match.group(1).strip() if match else body


def _load_json(text: str) -> Any:
    """The parsed JSON value, or None when the text is not valid JSON; a number past a double's
    range and the constants NaN/Infinity stay the text the model wrote (module docstring)."""
    try:
        return json.loads(
            text, parse_float=_finite_or_text, parse_int=_int_or_text, parse_constant=str
        )
    except (json.JSONDecodeError, RecursionError):
        return None


def _finite_or_text(literal: str) -> float | str:
    """A JSON number literal as a float, or as its own text when it overflows to infinity."""
    value = float(literal)
    return value if math.isfinite(value) else literal


def _int_or_text(literal: str) -> int | str:
    """A JSON integer literal as an int, or as its own text past Python's 4,300 digits."""
    try:
        return int(literal)
    except ValueError:
        return literal


def _as_tool_calls(value: Any, tool_names: set[str] | None, *, tagged: bool) -> list[dict]:
    """OpenAI tool calls from a JSON object or list of objects; [] unless every item is a call."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        call = _as_tool_call(item, tool_names, tagged=tagged)
        if call is None:
            return []
        calls.append(call)
    return calls


def _as_tool_call(value: Any, tool_names: set[str] | None, *, tagged: bool) -> dict | None:
    """One OpenAI tool call from `{"name", "arguments"|"parameters"}`, or None if it is not one.

    Inside `<tool_call>` tags a call without arguments means no arguments; untagged JSON must
    name its arguments, so that an ordinary JSON answer with a "name" field is not misread.
    """
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name or (tool_names is not None and name not in tool_names):
        return None
    if "arguments" in value:
        arguments = value["arguments"]
    elif "parameters" in value:
        arguments = value["parameters"]
    elif tagged:
        arguments = {}
    else:
        return None
    if isinstance(arguments, str):
        arguments = _load_json(arguments)
    if not isinstance(arguments, dict):
        return None
    call_id = "call_" + "".join(secrets.choice(_CALL_ID_ALPHABET) for _ in range(24))
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
