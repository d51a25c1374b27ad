"""A model whose chat template renders `tools` itself gets them through the template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.chat_messages import assistant_tool_calls, tool_result
from tests.support.servers import running_server

# A trimmed Qwen2.5-style template: tools in the system turn, calls and results as tagged blocks.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Template tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>"
    "<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "<|im_start|>assistant\n{{ message.content or '' }}"
    "{%- for call in message.tool_calls %}<tool_call>\n"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def tools_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tools-model") / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with running_server(folder, tmp_path_factory.mktemp("art-tools")) as running:
        yield running


def prompt_text(tools_server, tiny_model_dir, response) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tokenizer.decode(response["prompt_token_ids"])


def test_template_renders_the_tools_not_our_system_prompt(tools_server, tiny_model_dir):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [WEATHER],
        "max_tokens": 2,
    }
    response = httpx.post(f"{tools_server.url}/v1/chat/completions", json=body).json()
    text = prompt_text(tools_server, tiny_model_dir, response)
    assert "# Template tools" in text and '"get_weather"' in text
    assert "You may call one or more functions" not in text


def test_tool_turns_render_through_the_template(tools_server, tiny_model_dir):
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        assistant_tool_calls(("get_weather", '{"city": "Paris"}')),
        tool_result("call_1", "21 degrees"),
    ]
    body = {"model": "tiny", "messages": messages, "tools": [WEATHER], "max_tokens": 2}
    response = httpx.post(f"{tools_server.url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    text = prompt_text(tools_server, tiny_model_dir, response.json())
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n21 degrees\n</tool_response>" in text


def test_forced_tool_choice_still_returns_a_valid_call(tools_server):
    client = openai.OpenAI(base_url=f"{tools_server.url}/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        seed=1,
    )
    call = reply.choices[0].message.tool_calls[0]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Lyon")
