"""A tool result as the text of one tool message, by a fixed rule.

- text content: its text; several blocks are joined with a blank line;
- an image or audio block: a placeholder `[image: image/png, 1234 bytes]` (tool messages carry
  text only, and the models trained here read text);
- an embedded resource: `[resource <uri>]` then its text, or a placeholder for a blob;
- a resource link: `[resource link: <uri>]` with its name;
- no content but structured content: the structured content as JSON;
- `is_error`: the text is prefixed with `Tool error: ` so the agent can tell it failed.

A text over `max_chars` keeps its head and tail around a visible
`[... N characters cut ...]` marker: the agent sees that something was cut and how much.
"""

from __future__ import annotations

import base64
import json
from typing import Any

DEFAULT_MAX_RESULT_CHARS = 4000


def result_text(result: Any, max_chars: int = DEFAULT_MAX_RESULT_CHARS) -> tuple[str, bool]:
    """The tool message text of a `CallToolResult`, and whether it was shortened."""
    parts = [_block_text(block) for block in result.content or []]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    text = "\n\n".join(parts) if parts else "(no output)"
    if result.is_error:
        text = f"Tool error: {text}"
    return shorten(text, max_chars)


def shorten(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut to about `max_chars` around a marker that says how much was cut."""
    if len(text) <= max_chars:
        return text, False
    cut = len(text) - max_chars
    head = max_chars * 3 // 4
    tail = max_chars - head
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}", True


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource {resource.uri}]\n{text}"
        mime = getattr(resource, "mime_type", None) or "application/octet-stream"
        return f"[resource {resource.uri}: {mime}, {_decoded_size(resource.blob)} bytes]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}" + (f" ({block.name})]" if block.name else "]")
    return f"[{kind or type(block).__name__} content]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except ValueError:
        return len(data)
