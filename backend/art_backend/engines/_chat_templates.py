"""Chat templates a model may lack: `--chat-template FILE_OR_NAME`, and the refusal without one.

A base model (Gemma 3 270M, Llama 3 8B, Qwen base checkpoints) ships a tokenizer without a
chat template. Such a model is served through `/v1/completions` (plain text); chat requests
need a template, which `art-server --chat-template` supplies, overriding the tokenizer's own:

| name     | turns                                                     | ends a turn (stop) |
|----------|-----------------------------------------------------------|--------------------|
| `chatml` | `<|im_start|>role\\n...<|im_end|>\\n` (Qwen, SmolLM)        | `<|im_end|>`       |
| `gemma`  | `<start_of_turn>user\\n...<end_of_turn>\\n`, `model` role   | `<end_of_turn>`    |
| `llama3` | `<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>` | `<|eot_id|>`       |

A built-in is refused when the model's vocabulary lacks one of its special tokens as a single
token (a model never trained on `<|im_start|>` would read it as a dozen pieces). The token that
ends a turn joins the engine's stop tokens. Any other value is a Jinja file, read, parsed and
rendered once on a one-message conversation at start: what cannot be used stops the start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_backend._errors import InvalidRequestError

_CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Gemma has no system role: a system message opens the first user turn, as Gemma's own does.
_GEMMA = (
    "{{- bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set prefix = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '')"
    " + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
_LLAMA3 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class ChatTemplate:
    """A template to install on the tokenizer: its Jinja text, where it came from, the special
    tokens it writes (each must be one token of the vocabulary) and the one that ends a turn."""

    source: str  # a built-in's name, or the file's path
    text: str
    special_tokens: tuple[str, ...] = ()
    end_of_turn: str | None = None


BUILTIN_TEMPLATES: dict[str, ChatTemplate] = {
    "chatml": ChatTemplate("chatml", _CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    "gemma": ChatTemplate("gemma", _GEMMA, ("<start_of_turn>", "<end_of_turn>"), "<end_of_turn>"),
    "llama3": ChatTemplate(
        "llama3", _LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|eot_id|>"
    ),
}

_NAMES = ", ".join(BUILTIN_TEMPLATES)
OPTION_HINT = (
    f"start art-server with --chat-template NAME (built-in: {_NAMES}) or --chat-template "
    "FILE.jinja, or send plain text to POST /v1/completions"
)


def read_chat_template(option: str) -> ChatTemplate:
    """`--chat-template`'s value as a template: a built-in by name, else a Jinja file, read and
    parsed (before the model loads, so a typo fails at once); a clear error otherwise."""
    if option in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[option]
    path = Path(option).expanduser()
    if not path.is_file():
        what = "no such file" if not path.exists() else "not a file"
        raise InvalidRequestError(
            f"--chat-template {option!r}: not a built-in template ({_NAMES}) and {what}. "
            "Give a built-in's name or the path of a Jinja chat template file."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidRequestError(
            f"--chat-template {option!r}: the file cannot be read as UTF-8 text ({error})."
        ) from error
    if not text.strip():
        raise InvalidRequestError(f"--chat-template {option!r}: the file is empty.")
    _check_jinja_syntax(option, text)
    return ChatTemplate(str(path), text)


def install_chat_template(tokenizer: Any, template: ChatTemplate) -> list[int]:
    """Put `template` on the tokenizer (replacing its own) once the vocabulary has its special
    tokens and a one-message conversation renders; returns the ids that end a turn (stop)."""
    missing = [token for token in template.special_tokens if _single_id(tokenizer, token) is None]
    if missing:
        fitting = [name for name, t in BUILTIN_TEMPLATES.items() if _fits(tokenizer, t)]
        choice = (
            f"Built-in templates that fit this vocabulary: {', '.join(fitting)}."
            if fitting
            else "No built-in template fits it: give a Jinja file written for this model."
        )
        raise InvalidRequestError(
            f"--chat-template {template.source}: this model's vocabulary lacks "
            f"{', '.join(missing)} as single tokens, so the model would read the template's "
            f"turn markers as pieces of text it never learned. {choice}"
        )
    previous = tokenizer.chat_template
    tokenizer.chat_template = template.text
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=False
        )
    except Exception as error:  # jinja raises anything a template's code can raise
        tokenizer.chat_template = previous
        raise InvalidRequestError(
            f"--chat-template {template.source}: the template fails on a one-message "
            f"conversation ([{{'role': 'user', 'content': 'Hello'}}]): {error}"
        ) from error
    end = _single_id(tokenizer, template.end_of_turn) if template.end_of_turn else None
    return [end] if end is not None else []


def has_chat_template(tokenizer: Any) -> bool:
    """Whether chat requests can be rendered for this tokenizer."""
    return bool(getattr(tokenizer, "chat_template", None))


def no_template_message() -> str:
    """What a chat request on a model without a chat template is told (and the start warning)."""
    return (
        "This model's tokenizer has no chat template (a base model), so chat messages cannot "
        f"be turned into a prompt: {OPTION_HINT} (docs/models.md, 'Base models')."
    )


def template_refusal(tokenizer: Any, error: Exception) -> InvalidRequestError:
    """The 400 for a conversation the chat template could not render: no template at all, or
    the template's own complaint about these messages."""
    if not has_chat_template(tokenizer):
        return InvalidRequestError(no_template_message(), param="messages", code="no_chat_template")
    return InvalidRequestError(
        f"The model's chat template rejected these messages: {error}", param="messages"
    )


def _check_jinja_syntax(source: str, text: str) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers renders with this environment and extension: the same parser finds the error.
    environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        environment.parse(text)
    except TemplateSyntaxError as error:
        raise InvalidRequestError(
            f"--chat-template {source}: not a valid Jinja template (line {error.lineno}: "
            f"{error.message})."
        ) from error


def _single_id(tokenizer: Any, token: str) -> int | None:
    """The id `token` encodes to when it is one token of the vocabulary, else None."""
    if token not in tokenizer.get_vocab():
        return None
    ids = tokenizer.encode(token, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def _fits(tokenizer: Any, template: ChatTemplate) -> bool:
    return all(_single_id(tokenizer, token) is not None for token in template.special_tokens)
