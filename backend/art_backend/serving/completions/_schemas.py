"""The request of OpenAI's legacy Completions API (POST /v1/completions), validated by pydantic.

Ranges follow OpenAI's documentation, except `logprobs` (up to 20, as vLLM and our chat
`top_logprobs` allow; OpenAI stops at 5). What we do not do is refused by name with a 400:
`suffix` (insertion), `best_of` above `n` (server-side reranking), and `echo` with `logprobs`
(the prompt tokens' logprobs need a forward pass over the prompt, which the engine seam does
not offer; inventing them is not an option).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema

from art_backend.serving._request import (
    BodySized,
    LogitBias,
    StopSequences,
    refuse_unsupported,
    stop_list,
)
from art_backend.serving.chat._schemas import StreamOptions
from art_core.wire import SEED_RANGE

# OpenAI's default for this API (chat has none): a completion of 16 tokens unless told otherwise.
DEFAULT_MAX_TOKENS = 16
MAX_PROMPTS = 128  # prompts in one request
MAX_CHOICES = 256  # prompts x n: each choice is a row of the engine's batch

# A token id is a JSON integer (strict: `true` or "7" is not a token).
TokenId = Annotated[int, Strict(), Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Prompt = (
    str
    | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
)

# Fields we know and do not support: refused with a message rather than ignored.
UNSUPPORTED_FIELDS = {
    "suffix": "insertion (`suffix`) is not supported; put all the text in `prompt`",
}


class CompletionRequest(BodySized):
    """POST /v1/completions: text (or token ids) in, its continuation out, `n` per prompt."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: Prompt
    max_tokens: StrictInt | None = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # vLLM's extension
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)  # vLLM's extension
    n: StrictInt = Field(default=1, ge=1, le=64)
    best_of: StrictInt | None = Field(default=None, ge=1, le=64)
    stop: StopSequences = None
    seed: StrictInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias = None
    # vLLM's field: a text prompt gets the tokenizer's special tokens (a BOS) unless false.
    add_special_tokens: StrictBool = True
    user: str | None = None  # accepted, not used
    # Declared only to be refused by name (see UNSUPPORTED_FIELDS); not in the API description.
    suffix: SkipJsonSchema[Any] = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, prompt: Any) -> Any:
        # Before pydantic tries each form of the union (whose errors name the first form, "a
        # valid string", whatever was wrong): one message that says what is wrong.
        check_prompt_shape(prompt)
        return prompt

    _reject_unsupported = refuse_unsupported(UNSUPPORTED_FIELDS)

    # Checks across fields are validators of the later field (`info.data` holds the ones
    # declared before it), so the error names the field to change.
    @field_validator("n")
    @classmethod
    def _choices_bounded(cls, n: int, info: ValidationInfo) -> int:
        prompt = info.data.get("prompt")
        prompts = (
            len(prompt) if isinstance(prompt, list) and isinstance(prompt[0], str | list) else 1
        )
        if prompts * n > MAX_CHOICES:
            raise ValueError(
                f"{prompts} prompts x n={n} is {prompts * n} choices, more than {MAX_CHOICES} "
                "in one request; send fewer prompts per request"
            )
        return n

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if best_of is not None and best_of != n:
            raise ValueError(
                f"best_of ({best_of}) other than n ({n}) is not supported: choices are not "
                "reranked here; drop best_of, or sample n and pick among them yourself"
            )
        return best_of

    @field_validator("echo")
    @classmethod
    def _echo_without_logprobs(cls, echo: bool, info: ValidationInfo) -> bool:
        if echo and info.data.get("logprobs") is not None:
            raise ValueError(
                "echo with logprobs would need the prompt tokens' logprobs, which this server "
                "does not compute; drop echo (and prepend the prompt yourself) or logprobs"
            )
        return echo

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: texts, or token-id lists."""
        prompt = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]

    @property
    def stop_list(self) -> list[str]:
        return stop_list(self.stop)


_SHAPES = "a text, a list of texts, a list of token ids, or a list of lists of token ids"


def check_prompt_shape(prompt: Any) -> None:
    """`prompt` is one of the four forms OpenAI takes, with token ids integers >= 0; a
    ValueError saying what is wrong otherwise."""
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list):
        raise ValueError(f"must be {_SHAPES}")
    if not prompt:
        raise ValueError(f"must not be empty: give {_SHAPES}")
    if all(isinstance(item, str) for item in prompt):
        return
    if all(isinstance(item, list) for item in prompt):
        for number, ids in enumerate(prompt):
            if not ids:
                raise ValueError(f"prompt[{number}] is an empty list of token ids")
            _check_token_ids(ids, f"prompt[{number}]")
        return
    if any(isinstance(item, str | list) for item in prompt):
        raise ValueError(f"a list of mixed kinds: give {_SHAPES}")
    _check_token_ids(prompt, "prompt")


def _check_token_ids(ids: list[Any], where: str) -> None:
    for position, token in enumerate(ids):
        # A JSON `true` is no token id, nor is 1.0.
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise ValueError(f"{where}[{position}] is {token!r}: token ids are integers >= 0")
