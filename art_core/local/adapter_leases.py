"""ART's `art.local.adapter_leases`: the lease counter and the pins, at ART's path.

One implementation for every backend lives in `art_core.adapter_leases`; ART's LocalBackend
module imports the same names from its own.
"""

from art_core.adapter_leases import (
    AdapterLeaseManager,
    pin_inference_step,
    pin_inference_target,
    pinned_inference_name,
    pinned_inference_step,
)

__all__ = [
    "AdapterLeaseManager",
    "pin_inference_step",
    "pin_inference_target",
    "pinned_inference_name",
    "pinned_inference_step",
]
