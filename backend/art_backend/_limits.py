"""Size limits: one request must not freeze the event loop or fill the server's memory.

Checked before the expensive work, cheapest first; each refusal says which limit and what to do:

| limit                          | where                                   | answer                    |
|--------------------------------|-----------------------------------------|---------------------------|
| body bytes (`--max-body-mb`)   | `BodySizeLimitMiddleware`, as they come | 413                       |
| JSON values (`MAX_JSON_VALUES`)| `parse_json_object`, before parsing      | 400 `body`                |
| JSON nesting depth             | `check_json_depth`, after parsing        | 400 naming the field      |
| integers past 4,300 digits     | `parse_json_object`, while parsing       | 400 naming the field      |
| lone surrogates (`"\ud800"`)   | `parse_json_object`, after parsing       | 400 naming the field      |
| prompt characters vs context   | `ChatService.prepare`, before templating | 400 `messages` / `tools`  |
| schema properties and nodes    | `check_schema_sizes`, before compiling   | 400 naming the schema     |

Bodies over `PARSE_ON_LOOP_MAX_BYTES` are parsed on a worker thread (`parse_off_loop`, for the
generation routes and `CheckedJsonRoute` alike), and what passes the limits (tokenizing, compiling
a grammar) runs on worker threads too. A thread helps only between the interpreter's steps: one C
call (`json.loads`, a regular expression over the whole body) holds the interpreter lock
throughout, whatever thread makes it. So the number of values is bounded before parsing (6
million small values, 24 MB, held every other request 9 s), and that bound is counted in steps of
about a megabyte (a 28 MB string of `\\",` escapes held every route a second in one regex); a
body of millions of escapes, whose `json.loads` alone holds the lock for a third of a second, is
parsed in a child process (`_json_child`).

A refusal names its field by its JSON path (`messages[0].content`), or `body` when it is the body
as a whole (not JSON, not an object, too many values, nested too deep from the top) or the field
cannot be found cheaply.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from art_backend import _json_child as json_child
from art_backend._errors import (
    InvalidGrammarError,
    InvalidRequestError,
    RequestBodyTooLarge,
    error_body,
)
from art_backend._unicode import LONE_SURROGATE

MIB = 1024 * 1024
# 32 MiB holds a full 128k-token context as JSON several times over; what is larger is a mistake
# or an attack, and would cost seconds of parsing before any other check could refuse it.
DEFAULT_MAX_BODY_MB = 32
# Real requests nest a few levels (messages, content parts, schemas of nested objects). Deeper
# JSON fails somewhere: Python's parser stops near 1,000 levels, and serializers earlier on a
# deep call stack (a stored record read back through GET /v1/chat/completions/{id}).
MAX_JSON_DEPTH = 128
# A chat with a long tool list or a train request of 64 rollouts holds a few thousand values;
# parsing and validating 100,000 (33,000 messages) takes about 0.2 s on one core.
MAX_JSON_VALUES = 100_000
# OpenAI's limit for structured outputs, and where compiling stays about a second: llguidance
# takes ~1.5 s for 5,000 optional properties in one object (quadratic), ~0.6 s for 70,000 nodes.
MAX_SCHEMA_PROPERTIES = 5_000
MAX_SCHEMA_NODES = 50_000
# Bodies larger than this are parsed on a worker thread (`parse_off_loop`): a quarter megabyte
# parses in about a millisecond, on the loop, where a thread's hand-off would cost more.
PARSE_ON_LOOP_MAX_BYTES = 256 * 1024
# The string-stripping count runs over steps of this many bytes (then to the next quote): each
# step is one C call that holds the interpreter lock, about 40 ms at worst (tiny strings).
SCAN_STEP_BYTES = 1024 * 1024
WHOLE_BODY = "body"  # the `param` of a refusal of the body as a whole

ParsedT = TypeVar("ParsedT")


# ------------------------------------------------------------------------------------- body


class BodySizeLimitMiddleware:
    """Refuse request bodies over `max_bytes` with a 413, counting bytes as they arrive.

    A declared Content-Length over the limit is refused before the app runs; a chunked body is
    refused at the chunk that crosses it, so no more than `max_bytes` is ever held.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_bytes:
            await _too_large_response(self.max_bytes, scope["path"])(scope, receive, send)
            return

        received = 0
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestBodyTooLarge(_too_large_message(self.max_bytes))
            return message

        async def watching_send(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except RequestBodyTooLarge:
            # Raised where no exception handler answers it (a route reads the body outside the
            # app's handlers): answer here, unless a response is already on its way.
            if response_started:
                raise
            await _too_large_response(self.max_bytes, scope["path"])(scope, receive, send)


def _too_large_message(max_bytes: int) -> str:
    return (
        f"The request body is larger than this server's limit of {max_bytes / MIB:g} MiB. "
        "Send less in one request (split the batch, shorten the messages or metadata), or "
        "start art-server with a larger --max-body-mb."
    )


def _too_large_response(max_bytes: int, path: str) -> JSONResponse:
    body = error_body(path, _too_large_message(max_bytes), error_type="invalid_request_error")
    return JSONResponse(body, status_code=413)


# ------------------------------------------------------------------------------- JSON depth


def parse_json_object(body: bytes) -> dict[str, Any]:
    """Parse a request body that must be a JSON object of valid text, at most `MAX_JSON_VALUES`
    values nested at most `MAX_JSON_DEPTH` levels.

    Invalid JSON, another type, too many values, deeper nesting, an integer past Python's 4,300
    digits, or a lone surrogate (`"\ud800"` is valid JSON but no text: it cannot be tokenized,
    stored as UTF-8 or shown) is a 400 naming its field, or `body`.
    """
    # The cheap bound first; only a body over it has its strings taken out (text full of
    # commas) and is counted again.
    if (
        _value_count_bound(body) > MAX_JSON_VALUES
        and _values_outside_strings(body) > MAX_JSON_VALUES
    ):
        raise InvalidRequestError(
            f"The request body holds more than {MAX_JSON_VALUES:,} JSON values, more than this "
            "server parses in one request. Send fewer items in one request (split the batch).",
            param=WHOLE_BODY,
        )
    try:
        payload = json_child.loads(body)  # a body of millions of escapes: in a child process
    except RecursionError:
        # The parser gave up near 1,000 levels: find the top-level field that holds them.
        raise _too_deep(_field_too_deep_to_parse(body)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequestError(
            f"The request body is not valid JSON: {error}", param=WHOLE_BODY
        ) from error
    except ValueError as error:  # an integer of over 4,300 digits (Python's conversion limit)
        field = _field_of_long_integer(body)
        raise InvalidRequestError(
            f"{_holder(field)} a number this server does not read: {error}. Send it as a string, or a "
            "shorter number.",
            param=field,
        ) from error
    if not isinstance(payload, dict):
        raise InvalidRequestError("The request body must be a JSON object.", param=WHOLE_BODY)
    # Counting brackets runs at memchr speed; most bodies have too few to nest too deep.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
        check_json_depth(payload)
    if SURROGATE_ESCAPE.search(body):
        check_text(payload)
    return payload


def _value_count_bound(body: bytes) -> int:
    """An upper bound on the values in a JSON text, at memchr speed: one more than the commas
    and openings (commas inside strings make it larger, never smaller)."""
    return 1 + body.count(b",") + body.count(b"[") + body.count(b"{")


def _values_outside_strings(body: bytes) -> int:
    """One more than the commas and openings outside JSON strings (exact for valid JSON), counted
    in steps of about `SCAN_STEP_BYTES`, so that no single C call holds the interpreter lock long
    while the event loop waits for it (this runs on a worker thread for large bodies).

    Each step ends after a byte that is no backslash, so no escape is cut in two. Its escapes go
    first, at memchr speed (`\\\\` pairs, then `\\"`: a backslash run inside a string pairs from
    its left), so that every quote left opens or closes a string; a string cut by a step's end
    is closed on both sides of the cut, the strings taken out, and what is left counted.
    """
    count, start, inside = 1, 0, False
    while start < len(body):
        found = NOT_BACKSLASH.search(body, start + SCAN_STEP_BYTES)
        end = found.end() if found else len(body)
        piece = body[start:end].replace(b"\\\\", b"").replace(b'\\"', b"")
        ends_inside = inside ^ (piece.count(b'"') % 2 == 1)
        outside = PLAIN_STRING.sub(b"", b'"' * inside + piece + b'"' * ends_inside)
        count += outside.count(b",") + outside.count(b"[") + outside.count(b"{")
        start, inside = end, ends_inside
    return count


NOT_BACKSLASH = re.compile(rb"[^\\]")
# A JSON string once its escaped quotes and backslashes are gone.
PLAIN_STRING = re.compile(rb'"[^"]*"')
# The escape of a UTF-16 surrogate: the only way a JSON text carries one (UTF-8 cannot).
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _json_paths(payload: Any) -> Iterator[tuple[str, Any]]:
    """Every value of a parsed body with its JSON path (`messages[0].content`; "" for the body
    itself), in the body's order; iterative, so a deep body cannot overflow the stack."""
    stack: list[tuple[str, Any]] = [("", payload)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if isinstance(node, dict):
            children = [(f"{path}.{key}" if path else str(key), v) for key, v in node.items()]
        elif isinstance(node, list):
            children = [(f"{path}[{index}]", value) for index, value in enumerate(node)]
        else:
            continue
        stack.extend(reversed(children))


def check_text(payload: Any) -> None:
    """Raise a 400 naming the first field whose key or string holds a lone surrogate.

    json.loads joins an escaped pair (`"\ud83d\ude00"`) into one character, so what is left in
    a string after parsing is a half that cannot be encoded."""
    for path, node in _json_paths(payload):
        if isinstance(node, str) and LONE_SURROGATE.search(node):
            raise _lone_surrogate(path or WHOLE_BODY)
        if isinstance(node, dict) and any(LONE_SURROGATE.search(key) for key in node):
            raise _lone_surrogate(path or WHOLE_BODY, key=True)


def _holder(param: str) -> str:
    """How a refusal's sentence starts: "`messages[0].content` holds", or the body's."""
    return "The request body holds" if param == WHOLE_BODY else f"`{param}` holds"


def _lone_surrogate(param: str, *, key: bool = False) -> InvalidRequestError:
    what = "a key" if key else "text"
    return InvalidRequestError(
        f"{_holder(param)} {what} with a lone UTF-16 surrogate (an escape like \\ud800 without its "
        "pair), which is not text. Send valid Unicode: escape both halves of a pair, or the "
        "character itself in UTF-8.",
        param=param,
    )


class _UnreadInteger(str):
    """An integer literal past `int()`'s digit limit, kept as its text to find where it sits."""


def _integer_or_text(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return _UnreadInteger(text)


def _field_of_long_integer(body: bytes) -> str:
    """The JSON path of the first integer `int()` refuses (over 4,300 digits), found by parsing
    again with such integers kept as text; `body` when it sits at the top, or when a second
    parse would hold the interpreter lock too long (a body the child process parsed)."""
    if body.count(b"\\") > json_child.ESCAPES_FOR_A_CHILD:
        return WHOLE_BODY
    try:
        payload = json.loads(body, parse_int=_integer_or_text)
    except (ValueError, RecursionError):
        return WHOLE_BODY
    found = (path for path, node in _json_paths(payload) if isinstance(node, _UnreadInteger))
    return next(found, "") or WHOLE_BODY


async def parse_off_loop(
    body: bytes,
    parse: Callable[[bytes], ParsedT],
    *,
    on_loop_max_bytes: int = PARSE_ON_LOOP_MAX_BYTES,
) -> ParsedT:
    """`parse(body)`: on a worker thread when the body is over `on_loop_max_bytes`, so that
    other clients and `/health` are answered while it runs (a parser slower than `json.loads`
    per byte, a protobuf decoder in Python, passes a smaller size)."""
    if len(body) > on_loop_max_bytes:
        return await asyncio.to_thread(parse, body)
    return parse(body)


class CheckedJsonRoute(APIRoute):
    """A FastAPI route whose JSON body passes `parse_json_object` (off the event loop when
    large) before FastAPI validates it, so declared-model routes (training, `/v1/adapters`) have
    the limits, errors and responsiveness the generation routes have."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
            if kind == "application/json" or kind.endswith("+json"):
                body = await request.body()
                if body:
                    # FastAPI reads the body through `request.json()`, which keeps this result.
                    request._json = await parse_off_loop(body, parse_json_object)
            return await handler(request)

        return checked


def check_json_depth(payload: dict[str, Any], limit: int = MAX_JSON_DEPTH) -> None:
    """Raise a 400 naming the top-level field whose value nests the object deeper than `limit`."""
    for field, value in payload.items():
        if nests_deeper_than(value, limit - 1):
            raise _too_deep(field)


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` holds lists or objects more than `limit` levels deep."""
    if not isinstance(value, dict | list):
        return False
    # Iterative, so the check itself cannot overflow the stack it protects.
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def _field_too_deep_to_parse(body: bytes) -> str | None:
    """The top-level member whose value the parser could not descend, found member by member."""
    decoder = json.JSONDecoder()
    try:
        text = body.decode()
        index = _skip_space(text, 0)
        if text[index] != "{":
            return None
        index += 1
        while True:
            index = _skip_space(text, index)
            key, index = decoder.raw_decode(text, index)
            index = _skip_space(text, index)
            if text[index] != ":":
                return None
            index = _skip_space(text, index + 1)
            try:
                _, index = decoder.raw_decode(text, index)
            except RecursionError:
                return key if isinstance(key, str) else None
            index = _skip_space(text, index)
            if text[index] != ",":
                return None
            index += 1
    except (ValueError, IndexError):
        return None


def _skip_space(text: str, index: int) -> int:
    while text[index] in " \t\r\n":
        index += 1
    return index


def _too_deep(field: str | None) -> InvalidRequestError:
    where = f"`{field}` nests" if field else "The request body nests"
    return InvalidRequestError(
        f"{where} JSON more than {MAX_JSON_DEPTH} levels deep, the most this server accepts. "
        "Flatten the structure.",
        param=field or WHOLE_BODY,
    )


# ---------------------------------------------------------------------------------- schemas


def check_schema_sizes(schemas: list[tuple[str, Any]]) -> None:
    """Refuse schemas too large to compile quickly: (param, schema) pairs, counted together.

    Counts object properties and JSON nodes over all the schemas one request asks to enforce,
    and names the schema at which a total passes its limit.
    """
    properties = nodes = 0
    for param, schema in schemas:
        stack = [schema]
        while stack:
            node = stack.pop()
            nodes += 1
            if isinstance(node, dict):
                if isinstance(node.get("properties"), dict):
                    properties += len(node["properties"])
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
            if properties > MAX_SCHEMA_PROPERTIES or nodes > MAX_SCHEMA_NODES:
                raise _schema_too_large(param, properties > MAX_SCHEMA_PROPERTIES, len(schemas))


def _schema_too_large(param: str, by_properties: bool, count: int) -> InvalidGrammarError:
    what = (
        f"{MAX_SCHEMA_PROPERTIES:,} object properties"
        if by_properties
        else f"{MAX_SCHEMA_NODES:,} JSON values"
    )
    scope = "This schema has" if count == 1 else "With this schema, the schemas to enforce have"
    return InvalidGrammarError(
        f"{scope} more than {what} in all, more than this server compiles into a grammar "
        "(compiling takes seconds from there). Split the schema, or move rarely used "
        "parts out of it.",
        param=param,
    )
