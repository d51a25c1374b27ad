"""The request base every protocol's schema stands on (Chat Completions, Completions, Responses,
Messages): the body-sized request, the field checks they share (tool names, tool parameters, stop
sequences, metadata, logit bias) and the refusals they share, written once.

Each protocol declares its own fields; what it refuses by name goes through `refuse_unsupported`
(one message shape: "unsupported parameter: ..."), its `tool_choice` through `check_tool_choice`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Self, TypeVar

from pydantic import AfterValidator, BaseModel, PrivateAttr, ValidationInfo, field_validator

from art_backend._limits import parse_json_object
from art_backend.engines._engine import MAX_STOP_CHARACTERS

TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,18}")  # ASCII digits only: `str.isdigit` takes "²"


def check_tool_name(name: str) -> str:
    """A function name OpenAI accepts (chat tools and Responses tools alike)."""
    if not TOOL_NAME_PATTERN.fullmatch(name):
        raise ValueError("must be 1-64 characters of a-z, A-Z, 0-9, underscore or dash")
    return name


def check_parameters_schema(parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    """A tool's `parameters`: a JSON schema of an object (None: no parameters given)."""
    if parameters is None:
        return None
    if parameters.get("type", "object") != "object":
        raise ValueError('must be a JSON schema of "type": "object"')
    if "properties" in parameters and not isinstance(parameters["properties"], dict):
        raise ValueError("`properties` must be an object")
    return parameters


MAX_MESSAGES_STOP_SEQUENCES = 256  # Anthropic's API documents no bound; OpenAI's is 4


def check_stop_sequences(stop: str | list[str] | None) -> str | list[str] | None:
    """At most four non-empty stop sequences, as OpenAI allows, of bounded length in all."""
    if isinstance(stop, list) and len(stop) > 4:
        raise ValueError("at most 4 stop sequences")
    if isinstance(stop, list) and any(not s for s in stop):
        raise ValueError("stop sequences must not be empty")
    return check_stop_characters(stop)


def check_stop_characters(stop: str | list[str] | None) -> str | list[str] | None:
    """Stop strings of at most MAX_STOP_CHARACTERS characters in all (the engine's bound,
    `SamplingParams`'s own, checked here first for the protocols' message)."""
    stops = [stop] if isinstance(stop, str) else stop or []
    if sum(len(s) for s in stops) > MAX_STOP_CHARACTERS:
        raise ValueError(
            f"stop sequences hold at most {MAX_STOP_CHARACTERS:,} characters in all; "
            "stop on a shorter marker"
        )
    return stop


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's bounds on `metadata`: at most 16 pairs, keys of 64 and values of 512 characters."""
    if metadata is not None and len(metadata) > 16:
        raise ValueError("at most 16 key-value pairs")
    for key, value in (metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise ValueError("keys are at most 64 characters, values at most 512")
    return metadata


def check_logit_bias(bias: dict[str, float] | None) -> dict[str, float] | None:
    """`logit_bias` keys are token ids and values lie in [-100, 100]."""
    for token, value in (bias or {}).items():
        if not TOKEN_ID_KEY.fullmatch(token):
            raise ValueError(f"keys must be token ids, got {token!r}")
        if not -100 <= value <= 100:
            raise ValueError(f"bias for token {token} must be in [-100, 100]")
    return bias


# The checks as types: the protocols declare their fields with them.
ToolName = Annotated[str, AfterValidator(check_tool_name)]
StopSequences = Annotated[str | list[str] | None, AfterValidator(check_stop_sequences)]
LogitBias = Annotated[dict[str, float] | None, AfterValidator(check_logit_bias)]
Metadata = Annotated[dict[str, str] | None, AfterValidator(check_metadata)]


def stop_list(stop: str | list[str] | None) -> list[str]:
    """`stop` as a list (one string is one sequence)."""
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


# ------------------------------------------------------------------------------------ refusals


def _never_off(name: str, value: Any) -> bool:
    return False


def refuse_unsupported(
    fields: dict[str, str], *, off: Callable[[str, Any], bool] = _never_off
) -> Any:
    """A validator (assign it in the request class) that refuses each field of `fields` by name,
    with the reason `fields` gives, unless it is None or `off(name, value)` says the value means
    "off". Runs before the field's type is checked, so any value is refused by its name."""

    def reject(value: Any, info: ValidationInfo) -> Any:
        name = str(info.field_name)
        if value is not None and not off(name, value):
            raise ValueError(f"unsupported parameter: {fields[name]}")
        return value

    return field_validator(*fields, mode="before")(reject)


def _loaded_now(defer_loading: bool | None) -> bool | None:
    if defer_loading:
        raise ValueError("deferred tool loading (tool search) is not supported; drop it")
    return defer_loading


def refuse_deferred_loading() -> Any:
    """A validator (assign it in a tool's class) of its `defer_loading` (Responses and Messages
    tools): only "load it now" is served."""
    return field_validator("defer_loading")(_loaded_now)


def check_tool_choice(choice: Any, tool_names: Iterable[str], *, named: str | None = None) -> None:
    """A `tool_choice` other than none/auto needs `tools`, and the tool it names (`named`) must
    be one of them; a ValueError saying which otherwise."""
    tool_names = set(tool_names)
    if choice not in (None, "none", "auto") and not tool_names:
        raise ValueError("tool_choice needs `tools`")
    check_named_tool(named, tool_names)


def check_named_tool(named: str | None, tool_names: Iterable[str]) -> None:
    """The tool `tool_choice` names (None: it names none) is one of `tools`."""
    if named is not None and named not in set(tool_names):
        raise ValueError(f"tool_choice names {named!r}, which is not in `tools`")


# ----------------------------------------------------------------------------------- the base


class BodySized(BaseModel):
    """A request that knows the size of the body it came in (0 when built by the server):
    large ones are prepared in a lane of their own (`ChatService`)."""

    _body_bytes: int = PrivateAttr(default=0)

    @property
    def body_bytes(self) -> int:
        return self._body_bytes

    def came_in(self, body_bytes: int) -> Self:
        """Note the size of the body this request was parsed from; returns the request."""
        self._body_bytes = body_bytes
        return self


RequestT = TypeVar("RequestT", bound=BodySized)


def parse_request(model: type[RequestT], body: bytes) -> RequestT:
    """A request body validated by `model` (a 400 naming the field when it is wrong), knowing
    its size."""
    return model.model_validate(parse_json_object(body)).came_in(len(body))
