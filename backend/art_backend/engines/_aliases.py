"""What a trained model's plain name answers from: its highest served step, unless pinned.

`agent` (ART's `model=model.name`) is an alias. Unpinned, it means the highest `agent@N` the
engine serves. The training service pins it to the model's promoted step
(`art.PromotionGate`): a step the gate refused is trained and served as `agent@N` (for its
evaluation, or a pinned request), while `agent` keeps answering from the promoted step.

The pins belong to one engine, so they live beside it (serving and training both stand on the
engines): the chat service reads them and the training service writes them, each through the
engine both were built on (`alias_pins(engine)`). A pin whose step is not loaded is ignored:
the alias falls back to the highest served step rather than a 404.
"""

from __future__ import annotations

import weakref

__all__ = ["alias_pins"]

# engine -> {plain name: served `name@step`}; weak, so that a stopped engine takes its pins along.
_PINS: weakref.WeakKeyDictionary[object, dict[str, str]] = weakref.WeakKeyDictionary()


def alias_pins(engine: object) -> dict[str, str]:
    """The plain names pinned on `engine` (plain name -> served `name@step`), to read or set."""
    return _PINS.setdefault(engine, {})
