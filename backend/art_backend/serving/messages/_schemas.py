"""Request schema of POST /v1/messages (Anthropic's Messages API), validated by pydantic.

Field names follow the `anthropic` SDK's types (`MessageCreateParams`, `ToolParam`,
`ToolChoice*Param`, `TextBlockParam`, `ToolUseBlockParam`, `ToolResultBlockParam`). Only what a
text model with client tools can honour is accepted: text, `tool_use` and `tool_result` blocks,
client tools with an `input_schema`. Images, documents, search results, citations, thinking,
server tools, containers and MCP servers are refused by name with a 400. Hints that change
nothing about what is generated (`cache_control`, `metadata`, `service_tier`, ...) are accepted
and ignored, as Anthropic would accept them.
"""

from __future__ import annotations

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

from art_backend.serving._request import (
    MAX_MESSAGES_STOP_SEQUENCES,
    BodySized,
    ToolName,
    check_named_tool,
    check_parameters_schema,
    check_stop_characters,
    refuse_deferred_loading,
    refuse_unsupported,
)

# Content block types Anthropic defines that this server cannot take, with what to do instead.
UNSUPPORTED_BLOCKS = {
    "image": "images are not supported: this server serves a text model; send text blocks",
    "document": "documents are not supported: send the document's text in a text block",
    "search_result": "search result blocks are not supported: send their text in a text block",
    "thinking": "thinking blocks are not supported (this server serves non-reasoning models); "
    "drop them from the assistant turn",
    "redacted_thinking": "thinking blocks are not supported (this server serves non-reasoning "
    "models); drop them from the assistant turn",
    "container_upload": "containers are not supported",
}
SERVER_TOOL_BLOCK = (
    "server tool blocks (web search, code execution, ...) are not supported: declare a client "
    "tool with an `input_schema` and run it in your agent"
)
USER_BLOCKS = ("text", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use")

# Fields we know and do not support: refused by name. A value that means "off" passes.
UNSUPPORTED_FIELDS = {
    "thinking": "extended thinking is not supported (this server serves non-reasoning models); "
    'leave `thinking` unset, {"type": "disabled"} or {"type": "adaptive"}',
    "container": "containers (code execution) are not supported",
    "mcp_servers": "MCP servers are not supported here; run the MCP client in your agent and "
    "declare its tools in `tools`",
    "context_management": "context management is not supported",
}


def _block_type(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


class CacheControl(BaseModel):
    """`cache_control`: accepted and ignored (there is no prompt cache to steer here)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(BaseModel):
    """A `text` block, in any turn (or in `system`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    # An SDK that echoes an answer back sends `"citations": null`; real citations are refused.
    citations: Annotated[list[Any] | None, Field(max_length=0)] = None


class ToolUseBlock(BaseModel):
    """A tool call the model made earlier, sent back in an assistant turn."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: dict[str, Any] | None = None
    toolset_name: str | None = None


class ToolResultBlock(BaseModel):
    """The result of a tool call, sent in a user turn: a string or text blocks."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    # Not rendered: the chat template has no error flag, so the content is what the model reads.
    is_error: StrictBool | None = None
    cache_control: CacheControl | None = None
    toolset_name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        for index, block in enumerate(content if isinstance(content, list) else []):
            kind = _block_type(block)
            if kind != "text":
                reason = UNSUPPORTED_BLOCKS.get(str(kind), f"blocks of type {kind!r}")
                raise ValueError(f"content[{index}]: {reason} (a tool result holds text)")
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block.text for block in self.content)


# The tags hold "[" so that error locations drop them, as they drop pydantic's union branches.
ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text[block]")]
    | Annotated[ToolUseBlock, Tag("tool_use[block]")]
    | Annotated[ToolResultBlock, Tag("tool_result[block]")],
    Discriminator(lambda value: f"{_block_type(value)}[block]"),
]


class InputMessage(BaseModel):
    """One turn of `messages`: user or assistant (or system, which the SDK's types allow)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant", "system"]
    # A string is one text block; it is stored as that block.
    content: list[ContentBlock]

    @field_validator("content", mode="before", json_schema_input_type=str | list[ContentBlock])
    @classmethod
    def _known_blocks(cls, content: Any, info: ValidationInfo) -> Any:
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        role = info.data.get("role")
        allowed = {"assistant": ASSISTANT_BLOCKS, "user": USER_BLOCKS}.get(str(role), ("text",))
        for index, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                raise ValueError(f"content[{index}] must be an object (a content block)")
            kind = block.get("type")
            if kind in allowed:
                continue
            if not isinstance(kind, str):  # an object or a list: no block type to look up
                raise ValueError(
                    f"content[{index}].type must be a string naming the block "
                    f"({', '.join(allowed)}), not {type(kind).__name__}"
                )
            if kind in UNSUPPORTED_BLOCKS:
                reason = UNSUPPORTED_BLOCKS[kind]
            elif kind in ("text", "tool_use", "tool_result"):
                reason = f"a {role} turn cannot hold {kind} blocks; use {', '.join(allowed)}"
            else:
                reason = SERVER_TOOL_BLOCK
            raise ValueError(f"content[{index}] of type {kind!r}: {reason}")
        return content


class Tool(BaseModel):
    """A client tool: a name, a description and the JSON schema of its `input`."""

    model_config = ConfigDict(extra="forbid")

    name: ToolName
    input_schema: Annotated[dict[str, Any], AfterValidator(check_parameters_schema)]
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: StrictBool | None = None
    cache_control: CacheControl | None = None
    # Accepted and unused: they do not change what this server generates.
    input_examples: list[dict[str, Any]] | None = None
    eager_input_streaming: StrictBool | None = None
    allowed_callers: list[str] | None = None
    defer_loading: SkipJsonSchema[bool | None] = None

    _loaded_now = refuse_deferred_loading()


class ToolChoice(BaseModel):
    """`auto`, `any` (some tool), `tool` (that one) or `none`."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('`name` goes with type "tool", and only with it')
        return self


def _thinking_off(name: str, value: Any) -> bool:
    # Adaptive thinking lets the model decide, and a non-reasoning model decides not to.
    off = isinstance(value, dict) and value.get("type") in ("disabled", "adaptive")
    return name == "thinking" and off


class MessageCreateRequest(BodySized):
    """POST /v1/messages."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: StrictInt = Field(ge=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: Annotated[
        list[Annotated[str, Field(min_length=1)]] | None,
        Field(max_length=MAX_MESSAGES_STOP_SEQUENCES),
        AfterValidator(check_stop_characters),
    ] = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=0)
    stream: StrictBool = False
    # Accepted and unused: they do not change what is generated here.
    metadata: dict[str, Any] | None = None
    cache_control: CacheControl | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
    diagnostics: dict[str, Any] | None = None
    output_config: SkipJsonSchema[dict[str, Any] | None] = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    # Declared only to be refused by name (see UNSUPPORTED_FIELDS); not in the API description.
    thinking: SkipJsonSchema[Any] = None
    container: SkipJsonSchema[Any] = None
    mcp_servers: SkipJsonSchema[Any] = None
    context_management: SkipJsonSchema[Any] = None

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools_only(cls, tools: Any) -> Any:
        for index, tool in enumerate(tools if isinstance(tools, list) else []):
            kind = _block_type(tool)
            if kind not in (None, "custom"):
                raise ValueError(f"tools[{index}] is a {kind!r} tool: {SERVER_TOOL_BLOCK}")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _choice_names_a_tool(cls, choice: ToolChoice | None, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        if choice is not None and choice.type in ("any", "tool") and not tools:
            raise ValueError(f'tool_choice "{choice.type}" needs `tools`')
        check_named_tool(choice.name if choice is not None else None, (t.name for t in tools))
        return choice

    @field_validator("output_config")
    @classmethod
    def _no_output_config(cls, config: dict[str, Any] | None) -> dict[str, Any] | None:
        # `effort` is a hint a non-reasoning model has no use for (Claude Code sends it): ignored.
        for key, value in (config or {}).items():
            if key != "effort" and value is not None:
                raise ValueError(
                    f"output_config.{key} is not supported (structured outputs); leave it "
                    "unset, or use /v1/chat/completions with `response_format`"
                )
        return config

    _reject_unsupported = refuse_unsupported(UNSUPPORTED_FIELDS, off=_thinking_off)

    @property
    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        return "\n".join(block.text for block in self.system) or None


class CountTokensRequest(MessageCreateRequest):
    """POST /v1/messages/count_tokens: a Messages request without `max_tokens`."""

    max_tokens: SkipJsonSchema[int | None] = Field(default=None, ge=1)  # type: ignore[assignment]
