"""Groups that carry signal: which scenarios still teach, and steps that hold enough of them.

A group whose rewards are all equal (all failed, or all passed) gives GRPO no gradient, yet costs
its full sampling time. `GroupSignal` spends that time where the gradient is, in two ways, each
optional and each counted in the step's metrics:

* **Pass-rate memory** (`skip_settled`, on by default). Each scenario's groups are remembered
  across steps and epochs. A scenario whose last group was all-equal is skipped, before any
  sampling, the next 1, 2, 4, ... times its turn comes (doubling with each all-equal group in a
  row, at most `max_skips`), then tried again: the policy moves, and a scenario it never solved
  may become learnable (and a solved one may slip). Counted as `signal/skipped_scenarios`.
* **Dynamic sampling** (`min_trainable_groups=N`, DAPO's, as in verl and TRL). A step draws more
  scenarios while fewer than N of its groups have mixed rewards, at most `max_groups_per_step`
  groups in all. From the second step on it starts as many groups as the last step's share of
  groups with mixed rewards says it needs (so the extra rollouts batch with the others), then
  replaces each all-equal group as soon as it finishes. Counted as `signal/extra_groups`.

Both run through the loops users already write: `iterate_dataset(..., signal=signal)` with
`gather_trajectory_groups(batch.groups(make_group))`, and `PipelineTrainer(..., signal=signal)`
(whose steps already wait for `min_batch_size` groups with mixed rewards: there the signal adds
the pass-rate memory). Scenarios are told apart by `key(scenario)`; the default is the scenario
itself when it is hashable, else the sha256 of its JSON (`art.utils.scenario_hash`).

The skip schedule follows pre-rollout filtering by temporal consistency (GRESO, arXiv 2506.02177:
a prompt that was all-equal stays so with high probability over the next epochs); the
replacement of all-equal groups is DAPO's dynamic sampling (arXiv 2503.14476, §3.2).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from art_core.trajectories import TrajectoryGroup
from art_core.utils._hashes import scenario_hash

logger = logging.getLogger("art_core.signal")

REWARD_TIE = 1e-12  # rewards closer than this are equal (ART's zero-variance test)
MAX_OVERSAMPLE = 8  # a step starts at most 8x the groups it needs, whatever the last share was


def carries_signal(group: TrajectoryGroup) -> bool:
    """True when the group has two or more rewards that differ: GRPO can learn from it."""
    rewards = group.rewards
    return len(rewards) > 1 and any(abs(reward - rewards[0]) > REWARD_TIE for reward in rewards)


@dataclass
class ScenarioRecord:
    """What the signal remembers of one scenario."""

    groups: int = 0  # groups sampled
    settled_streak: int = 0  # all-equal groups in a row, up to the last one
    skips_left: int = 0  # turns still to be skipped
    skipped: int = 0  # turns skipped so far
    last_mean_reward: float | None = None


class GroupSignal:
    """Per-scenario pass-rate memory and dynamic sampling; see the module docstring.

    `GroupSignal()` skips scenarios whose last group was all-equal; add
    `min_trainable_groups=N` for steps of at least N groups with mixed rewards (at most
    `max_groups_per_step` groups sampled per step, default 4 x N).
    """

    def __init__(
        self,
        *,
        skip_settled: bool = True,
        max_skips: int = 4,
        min_trainable_groups: int | None = None,
        max_groups_per_step: int | None = None,
        key: Callable[[Any], Hashable] | None = None,
    ) -> None:
        if max_skips < 0:
            raise ValueError(f"GroupSignal: max_skips must be >= 0, got {max_skips}")
        if min_trainable_groups is not None and min_trainable_groups < 1:
            raise ValueError(
                f"GroupSignal: min_trainable_groups must be >= 1 (or None), got "
                f"{min_trainable_groups}"
            )
        if max_groups_per_step is not None:
            floor = min_trainable_groups or 1
            if max_groups_per_step < floor:
                raise ValueError(
                    f"GroupSignal: max_groups_per_step ({max_groups_per_step}) must be >= "
                    f"min_trainable_groups ({floor})"
                )
        self.skip_settled = skip_settled
        self.max_skips = max_skips
        self.min_trainable_groups = min_trainable_groups
        self.max_groups_per_step = max_groups_per_step or (
            None if min_trainable_groups is None else 4 * min_trainable_groups
        )
        self._key = key
        self.records: dict[Hashable, ScenarioRecord] = {}
        self._counts = _zero_counts()
        self._totals = _zero_counts()
        self._last_share: float | None = None  # the last step's share of groups with signal

    # ----------------------------------------------------------------------- per scenario

    def key_of(self, scenario: Any) -> Hashable:
        """The scenario's identity: `key(scenario)`, else itself if hashable, else a JSON hash."""
        if self._key is not None:
            return self._key(scenario)
        try:
            hash(scenario)
        except TypeError:
            try:
                return scenario_hash(scenario)
            except TypeError as error:
                raise TypeError(
                    f"GroupSignal cannot tell this scenario apart ({error}); pass "
                    "GroupSignal(key=lambda scenario: ...) returning a hashable id"
                ) from None
        return scenario  # type: ignore[no-any-return]

    def skip(self, scenario: Any) -> bool:
        """Whether to skip the scenario at this turn (a skip is used up and counted)."""
        if not self.skip_settled:
            return False
        record = self.records.get(self.key_of(scenario))
        if record is None or record.skips_left <= 0:
            return False
        record.skips_left -= 1
        record.skipped += 1
        self._count("skipped_scenarios")
        return True

    def record(self, scenario: Any, group: TrajectoryGroup) -> bool:
        """Remember the group sampled for `scenario`; True when it carries signal."""
        record = self.records.setdefault(self.key_of(scenario), ScenarioRecord())
        record.groups += 1
        rewards = group.rewards
        if rewards:
            record.last_mean_reward = sum(rewards) / len(rewards)
        trainable = carries_signal(group)
        if trainable:
            record.settled_streak = 0
            record.skips_left = 0
            self._count("trainable_groups")
        else:
            record.settled_streak += 1
            record.skips_left = min(2 ** (record.settled_streak - 1), self.max_skips)
            self._count("zero_variance_groups")
        self._count("groups")
        return trainable

    def groups_to_start(self, batch_size: int) -> int:
        """How many groups a step starts with: enough, at the last step's share of groups with
        mixed rewards, to expect `min_trainable_groups` of them (within the bound)."""
        target, share = self.min_trainable_groups, self._last_share
        if target is None or share is None:
            return batch_size
        wanted = math.ceil(target / max(share, 1 / MAX_OVERSAMPLE))
        return max(batch_size, min(wanted, self.max_groups_per_step or wanted))

    def count_extra(self) -> None:
        """One more group drawn by dynamic sampling."""
        self._count("extra_groups")

    # ------------------------------------------------------------------------- the counts

    def take_step_metrics(self) -> dict[str, float]:
        """The counts since the last call (`signal/...`) and the run's totals (`signal/cum/...`)."""
        step, self._counts = self._counts, _zero_counts()
        if step["groups"]:
            self._last_share = step["trainable_groups"] / step["groups"]
        metrics = {f"signal/{name}": float(value) for name, value in step.items()}
        metrics.update({f"signal/cum/{name}": float(v) for name, v in self._totals.items()})
        metrics["signal/settled_scenarios"] = float(
            sum(1 for record in self.records.values() if record.settled_streak > 0)
        )
        return metrics

    def _count(self, name: str) -> None:
        self._counts[name] += 1
        self._totals[name] += 1

    def __repr__(self) -> str:
        return (
            f"GroupSignal(skip_settled={self.skip_settled}, max_skips={self.max_skips}, "
            f"min_trainable_groups={self.min_trainable_groups}, "
            f"max_groups_per_step={self.max_groups_per_step}, scenarios={len(self.records)})"
        )


def _zero_counts() -> dict[str, int]:
    return dict.fromkeys(
        ("groups", "trainable_groups", "zero_variance_groups", "skipped_scenarios", "extra_groups"),
        0,
    )


_HINTED: set[str] = set()  # models told once per process


def hint_zero_variance(
    model: Any, metrics: Mapping[str, float], counts: Mapping[str, float]
) -> bool:
    """Warn once per model when at least half of a step's groups were all-equal: their
    sampling time bought no gradient. True when it warned.

    Not when the step's groups were gathered with a GroupSignal (`counts`, the gather's, holds
    its `signal/...`), whatever its settings: the program has chosen (`examples/demo.py` keeps
    dynamic sampling off, measured, and passes a signal that only counts)."""
    flat = metrics.get("groups/zero_variance", 0.0)
    total = flat + metrics.get("groups/trainable", 0.0)
    name = str(getattr(model, "name", ""))
    signalled = "signal/groups" in counts
    if signalled or total < 2 or flat < total / 2 or name in _HINTED:
        return False
    _HINTED.add(name)
    logger.warning(
        "%s: %d of %d groups of this step had all-equal rewards: GRPO learns nothing from them, "
        "and their sampling time is spent. iterate_dataset(..., signal=art.GroupSignal("
        "min_trainable_groups=%d)) with gather_trajectory_groups(batch.groups(make_group)) "
        "skips scenarios that stay all-equal and samples more until a step has enough groups "
        "with mixed rewards; a finer reward or a larger group also helps (art preflight tells "
        "which).",
        name or "model",
        int(flat),
        int(total),
        max(1, int(total) // 2),
    )
    return True
