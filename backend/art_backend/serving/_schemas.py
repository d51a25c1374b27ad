"""Request schemas of the HTTP API, validated by pydantic. Ranges follow OpenAI's documentation."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from art_core.wire import SEED_RANGE

TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# Fields OpenAI clients may send that do not change what is generated: accepted, not used.
IGNORED_FIELDS = {
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
}

# Fields we know and do not support: rejected with a message rather than ignored.
UNSUPPORTED_FIELDS = {
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "reasoning_effort": "this backend serves non-reasoning models; remove reasoning_effort",
    "verbosity": "verbosity is not supported",
    "functions": "the legacy `functions` field is not supported; use `tools`",
    "function_call": "the legacy `function_call` field is not supported; use `tool_choice`",
}


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


def check_stop_sequences(stop: str | list[str] | None) -> str | list[str] | None:
    """At most four non-empty stop sequences, as OpenAI allows."""
    if isinstance(stop, list) and len(stop) > 4:
        raise ValueError("at most 4 stop sequences")
    if isinstance(stop, list) and any(not s for s in stop):
        raise ValueError("stop sequences must not be empty")
    return stop


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's bounds on `metadata`: at most 16 pairs, keys of 64 and values of 512 characters."""
    if metadata is not None and len(metadata) > 16:
        raise ValueError("at most 16 key-value pairs")
    for key, value in (metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise ValueError("keys are at most 64 characters, values at most 512")
    return metadata


TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,18}")  # ASCII digits only: `str.isdigit` takes "²"


def check_logit_bias(bias: dict[str, float] | None) -> dict[str, float] | None:
    """`logit_bias` keys are token ids and values lie in [-100, 100]."""
    for token, value in (bias or {}).items():
        if not TOKEN_ID_KEY.fullmatch(token):
            raise ValueError(f"keys must be token ids, got {token!r}")
        if not -100 <= value <= 100:
            raise ValueError(f"bias for token {token} must be in [-100, 100]")
    return bias


# The checks as types: both protocols (Chat Completions, Responses) declare their fields with them.
ToolName = Annotated[str, AfterValidator(check_tool_name)]
StopSequences = Annotated[str | list[str] | None, AfterValidator(check_stop_sequences)]
LogitBias = Annotated[dict[str, float] | None, AfterValidator(check_logit_bias)]
Metadata = Annotated[dict[str, str] | None, AfterValidator(check_metadata)]


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message. Content is a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_where_required(self) -> Message:
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs `content`")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs `tool_call_id`")
        return self


class FunctionDefinition(BaseModel):
    name: ToolName
    description: str | None = None
    parameters: Annotated[dict[str, Any], AfterValidator(check_parameters_schema)] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(BaseModel):
    include_usage: bool = False


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


class ChatCompletionRequest(BodySized):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # vLLM's extension
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)  # vLLM's extension
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=64)
    stop: StopSequences = None
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = None
    # Accepted and unused; see IGNORED_FIELDS.
    user: str | None = None
    metadata: Metadata = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Declared only to be refused by name (see UNSUPPORTED_FIELDS); not in the API description.
    audio: SkipJsonSchema[Any] = None
    prediction: SkipJsonSchema[Any] = None
    web_search_options: SkipJsonSchema[Any] = None
    reasoning_effort: SkipJsonSchema[Any] = None
    verbosity: SkipJsonSchema[Any] = None
    functions: SkipJsonSchema[Any] = None
    function_call: SkipJsonSchema[Any] = None

    @field_validator(*UNSUPPORTED_FIELDS, mode="before")
    @classmethod
    def _reject_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(f"unsupported parameter: {UNSUPPORTED_FIELDS[str(info.field_name)]}")
        return value

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, response_format: dict[str, Any] | None) -> dict[str, Any] | None:
        if response_format is None:
            return None
        kind = response_format.get("type")
        if kind not in {"text", "json_object", "json_schema"}:
            raise ValueError("`type` must be one of text, json_object, json_schema")
        if kind == "json_schema":
            json_schema = response_format.get("json_schema")
            if not isinstance(json_schema, dict):
                raise ValueError(
                    'json_schema must be an object: {"name": ..., "schema": {...JSON Schema...}}'
                )
            if not isinstance(json_schema.get("schema"), dict):
                raise ValueError("json_schema.schema must be a JSON schema object")
        return response_format

    # Checks across fields are field validators of the later field (`info.data` holds the ones
    # declared before it), so the error names the field to change.
    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return top

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(cls, choice: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        if choice not in (None, "none", "auto") and not tools:
            raise ValueError("tool_choice needs `tools`")
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or not isinstance(name, str):
                raise ValueError('tool_choice must be {"type": "function", "function": {"name"}}')
            if name not in {tool.function.name for tool in tools}:
                raise ValueError(f"tool_choice names {name!r}, which is not in `tools`")
        return choice

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class LookupCompletionsRequest(BaseModel):
    """POST /v1/chat/completions/lookup: many stored records in one request (exporters, review)."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(max_length=10_000)
    # False leaves out the token ids and logprobs (most of a record's size) when only the
    # request, the answer, the usage and the timing are wanted.
    tokens: bool = True


class LoadAdapterRequest(BaseModel):
    """POST /v1/adapters: serve a LoRA checkpoint under `name@step`."""

    model_config = ConfigDict(extra="forbid")

    name: str
    path: str
