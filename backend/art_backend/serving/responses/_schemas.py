"""Request schema of POST /v1/responses (OpenAI's Responses API), validated by pydantic.

Only what a text model with function tools can honour is accepted: input as a string or as
message, `function_call` and `function_call_output` items; function tools; `text.format`.
Built-in tools, reasoning, background runs and server-side conversations are refused by name
with a 400 saying what to do instead. Ranges follow OpenAI's documentation; `seed`, `top_k`,
`stop`, the penalties and `logit_bias` are accepted as extensions (as vLLM does), so a training
rollout can sample exactly as it would through chat completions.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from art_backend._errors import InvalidRequestError
from art_backend.serving._request import (
    BodySized,
    LogitBias,
    Metadata,
    StopSequences,
    ToolName,
    check_parameters_schema,
    check_tool_choice,
    refuse_deferred_loading,
    refuse_unsupported,
)
from art_core.wire import SEED_RANGE

FORMAT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# `include` values OpenAI defines. Only the logprobs one changes what we return; the others name
# outputs of features this server refuses (built-in tools, images, reasoning), so they are no-ops.
KNOWN_INCLUDES = {
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
}

# Input item types we know and refuse, with what to do instead.
UNSUPPORTED_ITEMS = {
    "reasoning": "reasoning items are not supported (this server serves non-reasoning models); "
    "drop them from `input`",
    "item_reference": "item references are not supported; send the item itself in `input`",
    "compaction": "compaction items are not supported; send the conversation's messages",
}
SUPPORTED_ITEMS = ("message", "function_call", "function_call_output")

# Fields we know and do not support: refused with a message rather than ignored. A field whose
# value means "off" (background=false, an all-null reasoning) passes.
UNSUPPORTED_FIELDS = {
    "background": "background responses are not supported; leave `background` unset or false",
    "reasoning": "this backend serves non-reasoning models; remove `reasoning`",
    "conversation": "server-side conversations are not supported; chain turns with "
    "`previous_response_id` or send the whole conversation in `input`",
    "prompt": "stored prompt templates are not supported; send `instructions` and `input`",
    "context_management": "context management (compaction) is not supported",
    "moderation": "moderation is not supported",
    "image": "image options are not supported: this server generates text",
    "n": "the Responses API makes one answer per request; for several samples of one prompt "
    "use /v1/chat/completions with `n`, or send several requests",
}


class InputTextPart(BaseModel):
    """A text content part of an input message (`input_text`), or of an earlier answer that is
    sent back (`output_text`, `refusal`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["input_text", "output_text", "refusal"]
    text: str | None = None
    refusal: str | None = None
    # Present on `output_text` parts echoed from an earlier response; not used.
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    @model_validator(mode="after")
    def _has_its_text(self) -> InputTextPart:
        key = "refusal" if self.type == "refusal" else "text"
        if getattr(self, key) is None:
            raise ValueError(f"a part of type {self.type!r} needs `{key}`")
        return self

    @property
    def value(self) -> str:
        return (self.refusal if self.type == "refusal" else self.text) or ""


def _part_type(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


class MessageItem(BaseModel):
    """A message in `input`: user, system, developer, or an assistant turn sent back."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputTextPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        if isinstance(content, list):
            for part in content:
                kind = _part_type(part)
                if kind not in ("input_text", "output_text", "refusal"):
                    raise ValueError(
                        f"a content part of type {kind!r} is not supported: this server takes "
                        'text only ({"type": "input_text", "text": ...})'
                    )
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.value for part in self.content)


class FunctionCallItem(BaseModel):
    """A function call the model made earlier, sent back so the next turn sees it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(BaseModel):
    """The result of a function call, for the model to read."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[InputTextPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _text_parts_only(cls, output: Any) -> Any:
        return MessageItem._text_parts_only(output)

    @property
    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "\n".join(part.value for part in self.output)


def _item_type(value: Any) -> Any:
    # An item without `type` is a message (OpenAI's "easy input message").
    kind = _part_type(value)
    return "message" if kind is None else kind


# The tags hold "[" so that error locations drop them (`input[0].role`, not `input[0].message.role`),
# as they drop pydantic's own union branch names.
InputItem = Annotated[
    Annotated[MessageItem, Tag("message[item]")]
    | Annotated[FunctionCallItem, Tag("function_call[item]")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output[item]")],
    Discriminator(lambda value: f"{_item_type(value)}[item]"),
]


class FunctionTool(BaseModel):
    """A function tool, flattened as the Responses API writes it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: Annotated[dict[str, Any] | None, AfterValidator(check_parameters_schema)] = None
    strict: StrictBool | None = None
    # Describes what the function returns; the model never sees it here.
    output_schema: dict[str, Any] | None = None
    defer_loading: StrictBool | None = None
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None

    _loaded_now = refuse_deferred_loading()

    @field_validator("allowed_callers")
    @classmethod
    def _direct_calls(cls, callers: list[str] | None) -> list[str] | None:
        if callers and "direct" not in callers:
            raise ValueError('programmatic tool calling is not supported; allow "direct" calls')
        return callers


class ToolChoiceFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: free text, any JSON object, or JSON fitting a schema (always enforced)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def _schema_when_needed(self) -> TextFormat:
        if self.type == "json_schema":
            if self.name is None or not FORMAT_NAME_PATTERN.fullmatch(self.name):
                raise ValueError(
                    "a json_schema format needs a `name` of 1-64 letters, digits, '_' or '-'"
                )
            if self.schema_ is None:
                raise ValueError("a json_schema format needs `schema` (a JSON Schema object)")
        return self


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None
    verbosity: SkipJsonSchema[Any] = None

    @field_validator("verbosity", mode="before")
    @classmethod
    def _no_verbosity(cls, verbosity: Any) -> Any:
        if verbosity is not None:
            raise ValueError("verbosity is not supported; leave it unset")
        return verbosity


def _means_off(name: str, value: Any) -> bool:
    """Whether a refused field's value means "off" (background=false, n=1, an all-null
    reasoning), which passes."""
    if name == "reasoning" and isinstance(value, dict):
        return all(v is None for v in value.values())
    return value in (None, False) or (name == "n" and value == 1)


class ResponseCreateRequest(BodySized):
    """POST /v1/responses."""

    model_config = ConfigDict(extra="forbid")

    model: str
    # A string is one user message; it is stored as that item.
    input: list[InputItem] | None = None
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    store: StrictBool = True
    previous_response_id: str | None = None
    metadata: Metadata = None
    truncation: Literal["disabled"] | None = None
    # Accepted and unused: they do not change what is generated (`max_tool_calls` counts
    # built-in tool calls, which this server has none of).
    max_tool_calls: StrictInt | None = Field(default=None, ge=1)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    access_programs: dict[str, Any] | None = None
    background_options: SkipJsonSchema[Any] = None  # only means something with background
    # Extensions beyond OpenAI's Responses API, as in chat completions.
    seed: StrictInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    top_k: StrictInt | None = Field(default=None, ge=-1)
    stop: StopSequences = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias = None
    # Declared only to be refused by name (see UNSUPPORTED_FIELDS); not in the API description.
    background: SkipJsonSchema[Any] = None
    reasoning: SkipJsonSchema[Any] = None
    conversation: SkipJsonSchema[Any] = None
    prompt: SkipJsonSchema[Any] = None
    context_management: SkipJsonSchema[Any] = None
    moderation: SkipJsonSchema[Any] = None
    image: SkipJsonSchema[Any] = None
    n: SkipJsonSchema[Any] = None

    @field_validator("input", mode="before", json_schema_input_type=str | list[InputItem] | None)
    @classmethod
    def _string_or_known_items(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            return [{"type": "message", "role": "user", "content": value}]
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of input items")
        # Checked before the union is tried, so the error names the item type, not the union.
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise ValueError(f"input[{index}] must be an object (an input item)")
            kind = _item_type(item)
            if kind not in SUPPORTED_ITEMS:
                reason = UNSUPPORTED_ITEMS.get(
                    str(kind),
                    f"items of type {kind!r} (built-in tools and their calls) are not "
                    f"supported; use {', '.join(SUPPORTED_ITEMS)} items",
                )
                raise ValueError(f"input[{index}]: {reason}")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, tools: Any) -> Any:
        for index, tool in enumerate(tools if isinstance(tools, list) else []):
            kind = _part_type(tool)
            if kind != "function":
                raise ValueError(
                    f"tools[{index}] is a {kind!r} tool: built-in tools are not supported here; "
                    'declare a function tool ({"type": "function", "name": ..., "parameters": '
                    "...}) and run it in your agent"
                )
        return tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice_only(cls, choice: Any) -> Any:
        if isinstance(choice, dict) and choice.get("type") != "function":
            raise ValueError(
                f"tool_choice of type {choice.get('type')!r} is not supported; use "
                '"none", "auto", "required" or {"type": "function", "name": ...} '
                "(to allow only some tools, list only those in `tools`)"
            )
        return choice

    @field_validator("tool_choice")
    @classmethod
    def _choice_names_a_tool(cls, choice: Any, info: ValidationInfo) -> Any:
        named = choice.name if isinstance(choice, ToolChoiceFunction) else None
        check_tool_choice(choice, [t.name for t in info.data.get("tools") or []], named=named)
        return choice

    @field_validator("include")
    @classmethod
    def _known_includes(cls, include: list[str] | None) -> list[str] | None:
        for value in include or []:
            if value not in KNOWN_INCLUDES:
                raise ValueError(
                    f"unknown include value {value!r}; known: {', '.join(sorted(KNOWN_INCLUDES))}"
                )
        return include

    _reject_unsupported = refuse_unsupported(UNSUPPORTED_FIELDS, off=_means_off)

    @model_validator(mode="after")
    def _something_to_answer(self) -> ResponseCreateRequest:
        if self.input is None and self.previous_response_id is None:
            # Raised as it is (pydantic passes on what is no ValueError): a 400 naming `input`,
            # which a model validator's error could not name.
            raise InvalidRequestError(
                "`input` is required: a string or a list of input items", param="input"
            )
        return self

    @property
    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or "message.output_text.logprobs" in (
            self.include or []
        )
