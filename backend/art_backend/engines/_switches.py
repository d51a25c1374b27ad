"""On/off environment switches of the engine (`ART_BATCH_INVARIANT`, `ART_PACKED_LINEAR`,
`ART_DTYPE_PROBE`, `ART_ENGINE_PROFILE`): one parse, and a value that is neither is refused by
name at start (`ModelLoadError`) instead of being read as one or the other."""

from __future__ import annotations

import os

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def env_switch(variable: str, default: bool) -> bool:
    """`variable` read as on (1/true/yes/on) or off (0/false/no/off); unset or empty: `default`."""
    from art_backend._errors import ModelLoadError

    value = os.environ.get(variable, "").strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    default_name = "on" if default else "off"
    raise ModelLoadError(
        f"{variable}={os.environ[variable]!r} is neither on ({', '.join(ON)}) nor off "
        f"({', '.join(OFF)}); unset it to keep the default ({default_name})"
    )
