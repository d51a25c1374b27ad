"""Builders for OpenAI chat messages that the tool-call tests share."""

from __future__ import annotations


def assistant_tool_calls(*calls: tuple[str, str]) -> dict:
    """An assistant turn calling tools `(name, arguments JSON)`, with ids call_1, call_2, ..."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for number, (name, arguments) in enumerate(calls, start=1)
        ],
    }


def tool_result(call_id: str, content: str) -> dict:
    """The tool message answering one call."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# A function tool in the Chat Completions shape, with arguments a grammar can bound.
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two small numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 9},
                "b": {"type": "integer", "minimum": 0, "maximum": 9},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
