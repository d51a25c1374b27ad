"""Inputs a user writes refuse names they do not know: a typo is an error, never ignored.

`StrictModel` is the base of every pydantic model a user constructs (Trajectory, TrainConfig,
LoRAConfig, ...): an unknown keyword at construction, or an unknown attribute assigned, raises
`UnknownFieldError`; validation from data keeps pydantic's ValidationError (see the class).
`check_names` does the same for keyword arguments passed through to one
(`model.train(groups, **overrides)`). Models read back from the server (`TrainResult`) stay
lenient instead: a newer server may send fields this client does not know yet.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from art_core.errors import UnknownFieldError

# Spellings from other libraries that difflib would not match (too short, or a different word).
_ALIASES = {"lr": "learning_rate", "rank": "r", "lora_rank": "r"}


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name a typo most likely meant, or None."""
    known = list(known)
    if _ALIASES.get(name) in known:
        return _ALIASES[name]
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if matches:
        return matches[0]
    # A prefix of one name only (`messages` for `messages_and_choices`).
    extended = [k for k in known if k.startswith(f"{name}_")]
    return extended[0] if len(extended) == 1 else None


def check_names(
    owner: str,
    given: Iterable[str],
    known: Iterable[str],
    *,
    noun: str = "keyword",
    hints: Mapping[str, str] | None = None,
) -> None:
    """Raise `UnknownFieldError` if any of `given` is not in `known`, naming the closest."""
    known = sorted(known)
    unknown = [name for name in given if name not in known]
    if not unknown:
        return
    quoted = ", ".join(repr(name) for name in unknown)
    plural = "s" if len(unknown) > 1 else ""
    message = f"{owner}: unknown {noun}{plural} {quoted}"
    suggestions = [(name, closest_name(name, known)) for name in unknown]
    guesses = [f"{guess!r} for {name!r}" for name, guess in suggestions if guess is not None]
    if len(unknown) == 1 and guesses:
        message += f" (did you mean {suggestions[0][1]!r}?)"
    elif guesses:
        message += f" (did you mean {', '.join(guesses)}?)"
    message += f". Known {noun}s: {', '.join(known)}."
    for name in unknown:
        if hints and name in hints:
            message += f" {hints[name]}"
    raise UnknownFieldError(message, unknown=unknown, known=known)


class StrictModel(BaseModel):
    """A pydantic model a user writes: an unknown field raises `UnknownFieldError` (did-you-mean).

    Constructing with keywords and assigning an attribute get the worded `UnknownFieldError`;
    `model_validate(...)` and validation as part of another model keep pydantic's
    `ValidationError` (`extra="forbid"`), with the field's location: the server validates its
    request bodies with these same models and answers that error as a 400 naming the field.
    """

    model_config = ConfigDict(extra="forbid")

    # Per model: a sentence added to the error for a name users plausibly write.
    unknown_field_hints: ClassVar[dict[str, str]] = {}

    def __init__(self, /, **data: Any) -> None:
        _check_fields(type(self), data)
        super().__init__(**data)

    # Tells pydantic this __init__ is equivalent to BaseModel's (as RootModel does), so that
    # validation (`model_validate`, a nested model, the server's request bodies) does not call
    # it and keeps raising ValidationError.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in type(self).model_fields:
            _check_fields(type(self), {name: value})
        super().__setattr__(name, value)


def _check_fields(model: type[StrictModel], data: Mapping[str, Any]) -> None:
    check_names(
        model.__name__,
        [str(key) for key in data],
        model.model_fields,
        noun="field",
        hints=model.unknown_field_hints,
    )
