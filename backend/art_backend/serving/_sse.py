"""Server-sent events as every protocol writes them: one JSON `data:` line that no client can
cut in two, and the error event that ends a failed stream (OpenAI's shape)."""

from __future__ import annotations

import json
from typing import Any

# Characters that str.splitlines() treats as line breaks but json.dumps(ensure_ascii=False)
# leaves raw: a client that splits an SSE stream with splitlines (httpx's iter_lines does)
# would cut an event in two. Escaping them keeps every event on one line for any client.
_LINE_BREAKS_JSON_KEEPS = str.maketrans(
    {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def sse_error(message: str) -> str:
    """The `data:` event that ends a stream whose generation failed (OpenAI's error shape)."""
    error = {"message": message, "type": "server_error", "param": None, "code": None}
    return f"data: {json.dumps({'error': error})}\n\n"


def sse_json(body: Any) -> str:
    """JSON for one `data:` line: UTF-8 text kept, every line-break character escaped."""
    return json.dumps(body, ensure_ascii=False).translate(_LINE_BREAKS_JSON_KEEPS)
