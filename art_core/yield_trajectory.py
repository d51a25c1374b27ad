"""ART's `art.yield_trajectory`: a rollout hands a Trajectory it built by hand to
`capture_yielded_trajectory`, through a context variable.

Not implemented: here a rollout returns its Trajectory, or runs in `art.trajectory()`, where the
conversation comes from the server's records of its completions and the rollout sets reward and
metrics on `art.current_trajectory()`. Both names import; using one raises
`UnsupportedOptionError` saying so (`art_core/_refused_art_names.py`).

`art_core/__init__` imports them from here, as ART's does, so `art.yield_trajectory` stays the
(refused) function rather than becoming this module once it is imported.
"""

from art_core._refused_art_names import module_getattr

__all__: list[str] = []

__getattr__ = module_getattr("art.yield_trajectory", __name__)
