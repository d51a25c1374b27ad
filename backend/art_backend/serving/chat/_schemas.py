"""The request of POST /v1/chat/completions, validated by pydantic: its messages and tools, and
the fields it accepts unused or refuses by name. Ranges follow OpenAI's documentation."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from art_backend.serving._request import (
    BodySized,
    LogitBias,
    Metadata,
    StopSequences,
    ToolName,
    check_named_tool,
    check_parameters_schema,
    check_tool_choice,
    refuse_unsupported,
    stop_list,
)
from art_core.wire import SEED_RANGE

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

    @field_validator("content")
    @classmethod
    def _text_parts_carry_text(cls, content: Any) -> Any:
        # Once a `{"type": "text"}` part without its text read as empty text: a 200 for a typo.
        for number, part in enumerate(content if isinstance(content, list) else []):
            if part.get("type") == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f"part {number} is a text part without a string `text`")
        return content

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
    strict: StrictBool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class ChatCompletionRequest(BodySized):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # vLLM's extension
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)  # vLLM's extension
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    n: StrictInt = Field(default=1, ge=1, le=64)
    stop: StopSequences = None
    seed: StrictInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    response_format: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = None
    # Accepted and unused; see IGNORED_FIELDS.
    user: str | None = None
    metadata: Metadata = None
    store: StrictBool | None = None
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

    _reject_unsupported = refuse_unsupported(UNSUPPORTED_FIELDS)

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
        names = [tool.function.name for tool in info.data.get("tools") or []]
        check_tool_choice(choice, names)
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or not isinstance(name, str):
                raise ValueError('tool_choice must be {"type": "function", "function": {"name"}}')
            check_named_tool(name, names)
        return choice

    @property
    def stop_list(self) -> list[str]:
        return stop_list(self.stop)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
