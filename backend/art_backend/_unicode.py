"""Lone UTF-16 surrogates: refused in what arrives, tolerated in what is read back from disk.

`"\ud800"` is valid JSON and a valid Python string, but not text: it cannot be encoded as UTF-8,
so a tokenizer, a UTF-8 file or a response body fails on it. Requests holding one are refused
with a 400 naming the field (`_limits.check_text`). Files written before that rule, or by another
program, may still hold one: pages and JSON answers built from them encode it as U+FFFD (HTML) or
as a `\\ud800` escape (JSON) rather than failing with a 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD (the replacement character)."""
    return LONE_SURROGATE.sub("\ufffd", text)


def encode_text(text: str) -> bytes:
    """`text` as UTF-8, each lone surrogate written as U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return replace_lone_surrogates(text).encode("utf-8")


class TolerantHTMLResponse(HTMLResponse):
    """An HTML page that shows a lone surrogate as U+FFFD instead of failing."""

    def render(self, content: Any) -> bytes | memoryview:
        return encode_text(content) if isinstance(content, str) else super().render(content)


class TolerantJSONResponse(JSONResponse):
    """A JSON answer that escapes a lone surrogate (`\\ud800`, valid JSON) instead of failing."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(
                content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
            ).encode("ascii")


def tolerant_app(title: str, **options: Any) -> FastAPI:
    """A FastAPI app whose JSON answers are `TolerantJSONResponse`s, without FastAPI's docs
    pages (`art-server` and the review app; `options` go to `FastAPI`)."""
    return FastAPI(
        title=title,
        docs_url=None,
        redoc_url=None,
        default_response_class=TolerantJSONResponse,
        **options,
    )
