"""`scenario_hash`: the sha256 of a scenario's canonical JSON, for the step's replay manifest.

The server records `trajectory.metadata["scenario_sha256"]` in each step's `replay.json`; only
your rollout knows which scenario a trajectory answered, so it sets it:

    trajectory.metadata["scenario_sha256"] = art_core.utils.scenario_hash(scenario)

Canonical JSON: keys sorted, no spaces, UTF-8 (`ensure_ascii=False`); a pydantic model is
dumped in JSON mode, a dataclass as its fields. Equal scenarios hash equally on any machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from pydantic import BaseModel


def scenario_hash(scenario: Any) -> str:
    """The sha256 (hex) of `scenario`'s canonical JSON; a TypeError if it is not JSON data."""
    if isinstance(scenario, BaseModel):
        data = scenario.model_dump(mode="json")
    elif dataclasses.is_dataclass(scenario) and not isinstance(scenario, type):
        data = dataclasses.asdict(scenario)
    else:
        data = scenario
    try:
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"scenario_hash(): the scenario is not JSON data ({error}); hash a dict, list, "
            "string, number, pydantic model or dataclass of those."
        ) from error
    return hashlib.sha256(canonical.encode()).hexdigest()
