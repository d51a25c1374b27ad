"""The one name rule, shared by the client and the server.

Every name that reaches a URL or the filesystem passes one of these checks:

    project, model name        1-100 of  A-Z a-z 0-9 . _ -   starting with a letter or digit, no ".."
    split                      1-40  of  A-Z a-z 0-9 _ -     (no "." : it names a folder beside files)
    rollout id                 1-128 of  A-Z a-z 0-9 . _ : -
    served base-model name     1-128 of  A-Z a-z 0-9 . _ / -  no "..", no "@"
    adapter (served step)      <model name>@<step>, step 0-999999999

The default model has one canonical hub id and one short alias; both, in any letter case, name it.
"""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SPLIT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
SERVED_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
ADAPTER_NAME_PATTERN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,99})@([0-9]{1,9})$")

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_MODEL_ALIAS = "smollm2-135m-instruct"


def is_name(value: str) -> bool:
    """True for a valid project or model name (safe as one path component)."""
    return bool(NAME_PATTERN.fullmatch(value)) and ".." not in value


def check_name(value: str, what: str) -> str:
    """Return `value` if it is a valid project/model name, else raise ValueError naming `what`."""
    if not isinstance(value, str) or not is_name(value):
        raise ValueError(
            f"invalid {what} {value!r}: use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no '..')"
        )
    return value


def is_split(value: str) -> bool:
    """True for a valid split name ("train", "val", "eval-hard", ...)."""
    return bool(SPLIT_PATTERN.fullmatch(value))


def check_split(value: str) -> str:
    """Return `value` if it is a valid split name, else raise ValueError."""
    if not isinstance(value, str) or not is_split(value):
        raise ValueError(
            f"invalid split {value!r}: use 1-40 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def is_rollout_id(value: str) -> bool:
    """True for a valid rollout id."""
    return bool(ROLLOUT_ID_PATTERN.fullmatch(value))


def is_served_name(value: str) -> bool:
    """True for a valid served base-model name (a hub id such as owner/name is one)."""
    return bool(SERVED_NAME_PATTERN.fullmatch(value)) and ".." not in value and "@" not in value


def is_adapter_name(value: str) -> bool:
    """True for `<model name>@<step>`, the served name of one checkpoint."""
    match = ADAPTER_NAME_PATTERN.fullmatch(value)
    return match is not None and is_name(match.group(1))


def is_default_model(value: str) -> bool:
    """True when `value` names the embedded default model (hub id or alias, any letter case)."""
    return value.strip().lower() in (DEFAULT_MODEL.lower(), DEFAULT_MODEL_ALIAS)


def base_model_aliases(base_model: str) -> list[str]:
    """Names a client may use for this base model: as given, plus both default names for it."""
    if is_default_model(base_model):
        return list(dict.fromkeys([base_model, DEFAULT_MODEL, DEFAULT_MODEL_ALIAS]))
    return [base_model]


__all__ = [
    "ADAPTER_NAME_PATTERN",
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_ALIAS",
    "NAME_PATTERN",
    "ROLLOUT_ID_PATTERN",
    "SERVED_NAME_PATTERN",
    "SPLIT_PATTERN",
    "base_model_aliases",
    "check_name",
    "check_split",
    "is_adapter_name",
    "is_default_model",
    "is_name",
    "is_rollout_id",
    "is_served_name",
    "is_split",
]
