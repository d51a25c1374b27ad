"""The review page's filters: reward range, split, exceptions, flagged, a metric's range, text.

Parsed from the query of a step or search page; an unknown field or a bad number is a 400 that
names it, never ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from art_backend._errors import InvalidRequestError
from art_backend.review._browse import GroupView, TrajectoryView
from art_core.names import is_split

FILTER_FIELDS = (
    "min_reward",
    "max_reward",
    "split",
    "exceptions",
    "flagged",
    "metric",
    "metric_min",
    "metric_max",
    "q",
)


@dataclass
class TrajectoryFilter:
    """What the filter form asks for; every field optional."""

    min_reward: float | None = None
    max_reward: float | None = None
    split: str | None = None
    exceptions: bool = False  # only groups that have exceptions
    flagged: bool = False  # only flagged trajectories
    metric: str | None = None
    metric_min: float | None = None
    metric_max: float | None = None
    text: str = ""

    @property
    def active(self) -> bool:
        return any(
            value not in (None, False, "")
            for name, value in self.__dict__.items()
            if name != "split"
        )

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> TrajectoryFilter:
        """Parse the form's query; an unknown field or a bad number is a 400 naming it."""
        for name in query:
            if name not in FILTER_FIELDS:
                raise InvalidRequestError(
                    f"Unknown filter {name!r}: use {', '.join(FILTER_FIELDS)}.", param=name
                )
        split = query.get("split") or None
        if split is not None and not is_split(split):
            raise InvalidRequestError(f"Invalid split {split!r}.", param="split")
        return cls(
            min_reward=query_number(query, "min_reward"),
            max_reward=query_number(query, "max_reward"),
            split=split,
            exceptions=_flag(query, "exceptions"),
            flagged=_flag(query, "flagged"),
            metric=query.get("metric") or None,
            metric_min=query_number(query, "metric_min"),
            metric_max=query_number(query, "metric_max"),
            text=query.get("q", "").strip(),
        )

    def matches(self, trajectory: TrajectoryView) -> bool:
        if self.min_reward is not None and trajectory.reward < self.min_reward:
            return False
        if self.max_reward is not None and trajectory.reward > self.max_reward:
            return False
        if self.flagged and not trajectory.flagged:
            return False
        if self.metric:
            value = trajectory.row.get("metrics", {}).get(self.metric)
            if not isinstance(value, int | float):
                return False
            if self.metric_min is not None and value < self.metric_min:
                return False
            if self.metric_max is not None and value > self.metric_max:
                return False
        return not self.text or self.text.lower() in trajectory.text().lower()

    def apply(self, groups: list[GroupView]) -> list[GroupView]:
        """The groups with at least one match (or, for `exceptions`, an exception), narrowed."""
        kept = []
        for group in groups:
            if self.exceptions and not group.exceptions:
                continue
            matching = [t for t in group.trajectories if self.matches(t)]
            if matching or (self.exceptions and not self._narrows_trajectories()):
                kept.append(GroupView(group.index, matching, group.exceptions, group.flag))
        return kept

    def _narrows_trajectories(self) -> bool:
        return any(
            value not in (None, False, "")
            for name, value in self.__dict__.items()
            if name not in ("split", "exceptions")
        )


def query_number(query: Mapping[str, str], name: str) -> float | None:
    """The finite number a query parameter holds, None when it is empty; else a 400."""
    text = query.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InvalidRequestError(f"{name} must be a number, got {text!r}.", param=name) from None
    if not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {text!r}.", param=name)
    return value


def _flag(query: Mapping[str, str], name: str) -> bool:
    text = query.get(name, "").strip().lower()
    if text in ("", "0", "false", "off", "no"):
        return False
    if text in ("1", "true", "on", "yes", "only"):
        return True
    raise InvalidRequestError(f"{name} must be on or off, got {text!r}.", param=name)
