"""Environment settings of the engine: on/off switches (`ART_BATCH_INVARIANT`,
`ART_PACKED_LINEAR`, `ART_DTYPE_PROBE`, `ART_ENGINE_PROFILE`) and bounded numbers
(`ART_ADMIT_WINDOW_MS`). One parse each, and a value that is neither is refused by name at
start (`ModelLoadError`) instead of being read as something else."""

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


def env_number(variable: str, default: float, low: float, high: float, unit: str = "") -> float:
    """`variable` read as a number from `low` to `high` (`unit` names it in the refusal);
    unset or empty: `default`. Anything else (text, NaN, out of bounds) is refused by name."""
    from art_backend._errors import ModelLoadError

    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not low <= number <= high:  # NaN fails both
        of = f" of {unit}" if unit else ""
        raise ModelLoadError(
            f"{variable}={os.environ[variable]!r} is not a number{of} from {low:g} to {high:g}; "
            f"unset it to keep the default ({default:g})"
        )
    return number
