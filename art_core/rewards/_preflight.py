"""Preflight: "will this learn?" — a couple of groups rolled out and judged, without training.

    result = await art.preflight(model, rollout, scenarios, judge=judge, steps=20)
    print(result)            # the numbers, the verdict and the one change most likely to help

GRPO learns only from differences inside a group: a run's advantage is its reward minus its
group's mean. So before paying for a run, preflight measures what makes that difference exist:
how many groups are flat (zero variance: no gradient at all), how often the judge gives two
different runs the same score (ties), how much its scores move when the same runs are shown in
the other order (position gap: a ranking by position, not by content), how far rewards spread
inside a group, and what a step costs here (seconds, judge tokens and dollars).

The thresholds (see `THRESHOLDS`) and why:

- rollouts failing >= 50%: a failed rollout gives no reward; most of each step would be lost.
- judge tie rate >= 50% of pairs of different runs: at least half of the ranking the judge is
  paid for is missing, and a group whose runs all tie is flat. Measured: the 135M offline judge
  ties nearly every pair; a competent judge ties few.
- judge position gap >= 0.2 (mean |score change| on the 0–1 scale when the order flips): as
  large as a typical within-group reward spread, so the gradient would follow the position.
- zero-variance groups >= 75%: (with 2 groups: both) essentially no gradient -> will not learn;
  >= 50%: half the rollout compute trains nothing -> may learn slowly.
- within-group reward spread (mean standard deviation) < 0.05 on a 0–1 reward: the runs are
  nearly equal; GRPO's normalised advantages then amplify noise.

The one change is chosen from what the flat groups look like: identical runs -> a higher
temperature; a metric that differs where the reward does not -> a shaped reward; every run at
no reward -> an SFT warm start (the model never succeeds on its own); flat groups beside groups
that do differ, or flat at different values -> a larger group (the chance that every run of a
group gets the same reward falls geometrically with its size); a judge that ties or follows the
position -> a better judge.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from art_core._unknown_fields import check_names
from art_core.errors import JudgeError, PreflightError
from art_core.gather import gather_trajectory_groups
from art_core.model import Model
from art_core.rewards._judge_models import resolve_model
from art_core.rewards._judge_usage import JudgeUsage
from art_core.rewards._ruler_prompt import DEFAULT_RUBRIC
from art_core.rewards.ruler import RULER_OPTIONS, judged_messages, ruler
from art_core.trajectories import Trajectory, TrajectoryGroup

PreflightRollout = Callable[[Any, Any], Awaitable[Trajectory]]  # rollout(model, scenario)

THRESHOLDS = {
    "failed_rollouts": 0.5,
    "judge_tie_rate": 0.5,
    "judge_position_gap": 0.2,
    "zero_variance_blocks": 0.75,
    "zero_variance_slows": 0.5,
    "min_reward_spread": 0.05,
}

# The one change preflight can recommend, with what to do.
CHANGES = {
    "fix the rollout": "most rollouts raise; fix the error below before anything else",
    "a better judge": "use a stronger judge (e.g. --judge openai/gpt-4.1-mini), or a code reward",
    "higher temperature": "the runs of a group are identical; sample at temperature 1.0 or more",
    "a shaped reward": "pay partial credit so that different runs get different rewards",
    "SFT warm start": "the model never earns reward on its own; train_sft on a few dozen "
    "demonstrations first, then RL",
    "larger group": "raise rollouts_per_group (e.g. 8) so a group more often holds a different run",
}

_TIE = 1e-9


@dataclass
class PreflightResult:
    """What a preflight measured, its verdict and the one change most likely to help.

    Rewards are the judge's (the mean of both orders) when a judge was given, else the
    rollouts'. `*_per_step` figures are scaled from the preflight's groups to `groups_per_step`;
    `expected_wall_seconds` is `steps * seconds_per_step` and includes training only when
    `train_seconds_per_step` was given (preflight does not train).
    """

    groups: int
    rollouts_per_group: int
    rollouts: int
    failed_rollouts: int
    zero_variance_share: float
    reward_mean: float
    reward_min: float
    reward_max: float
    reward_spread: float
    identical_run_share: float
    judged: bool
    judge_tie_rate: float | None
    judge_position_gap: float | None
    judge_failures: int
    rollout_seconds_per_step: float
    judge_seconds_per_step: float
    train_seconds_per_step: float | None
    seconds_per_step: float
    judge_tokens_per_step: float
    judge_cost_usd_per_step: float
    steps: int
    groups_per_step: int
    expected_wall_seconds: float
    verdict: str
    change: str | None
    advice: str
    reasons: list[str] = field(default_factory=list)
    first_error: str | None = None

    @property
    def will_learn(self) -> bool:
        """True for "likely to learn" and "may learn slowly"."""
        return self.verdict.startswith(("likely", "may"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able numbers and strings (`art preflight --json`)."""
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def text(self) -> str:
        """The readable rendering: numbers, verdict, the change and why."""

        def pct(value: float | None) -> str:
            return "n/a (no judge)" if value is None else f"{value:.0%}"

        train = (
            f"{self.train_seconds_per_step:.1f} s"
            if self.train_seconds_per_step is not None
            else "not measured (preflight does not train)"
        )
        lines = [
            f"Preflight: {self.groups} groups x {self.rollouts_per_group} rollouts "
            f"({self.failed_rollouts} of {self.rollouts} failed)",
            f"  zero-variance groups   {self.zero_variance_share:.0%}"
            f"   (identical runs in {self.identical_run_share:.0%} of groups)",
            f"  reward                 mean {self.reward_mean:.3f}, range "
            f"{self.reward_min:.3f}..{self.reward_max:.3f}, spread {self.reward_spread:.3f}",
            f"  judge tie rate         {pct(self.judge_tie_rate)}",
            "  judge position gap     "
            + (
                "n/a (no judge)"
                if self.judge_position_gap is None
                else f"{self.judge_position_gap:.3f}"
            )
            + (f"   ({self.judge_failures} groups failed)" if self.judge_failures else ""),
            f"  seconds per step       {self.seconds_per_step:.1f} (rollouts "
            f"{self.rollout_seconds_per_step:.1f}, judge {self.judge_seconds_per_step:.1f}, "
            f"training {train})",
            f"  judge per step         {self.judge_tokens_per_step:.0f} tokens, "
            f"${self.judge_cost_usd_per_step:.4f}",
            f"  expected wall time     {self.expected_wall_seconds / 60:.1f} min for "
            f"{self.steps} steps x {self.groups_per_step} groups",
            f"Verdict: {self.verdict}",
        ]
        if self.change:
            lines.append(f"One change: {self.change} — {self.advice}")
        lines += [f"  - {reason}" for reason in self.reasons]
        if self.first_error:
            lines.append(f"First rollout error: {self.first_error}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


async def preflight(
    model: Model,
    rollout: PreflightRollout,
    scenarios: Sequence[Any],
    *,
    groups: int = 2,
    rollouts_per_group: int = 4,
    judge: Model | str | None = None,
    rubric: str = DEFAULT_RUBRIC,
    judge_options: Mapping[str, Any] | None = None,
    steps: int = 10,
    groups_per_step: int | None = None,
    train_seconds_per_step: float | None = None,
    show_progress: bool = False,
) -> PreflightResult:
    """Run `groups` groups of `rollout(model, scenario)` without training; measure and judge.

    `rollouts_per_group` is the configured run's group size; `judge` (an `art.Model` or
    `"<provider>/<model>"`) has RULER score each group in both orders, by `rubric`;
    `judge_options` go to `art.ruler` (the cache is off unless given, so the cost and time are
    real). `steps` and `groups_per_step` (default `groups`) describe the configured run;
    `train_seconds_per_step` (a measured training step) is added to the estimate. Impossible
    values raise `PreflightError`; an unknown judge option `UnknownFieldError`. The scenarios
    used are the first `groups` (repeated when fewer).
    """
    groups_per_step = groups_per_step or groups
    options = dict(judge_options or {})
    check_names("preflight(judge_options=...)", options, [*RULER_OPTIONS])
    options.pop("usage", None)
    options.setdefault("cache", False)
    _check_inputs(rollout, scenarios, rollouts_per_group, groups, steps, groups_per_step)
    judge_model = resolve_model(judge) if judge is not None else None
    chosen = [scenarios[k % len(scenarios)] for k in range(groups)]

    started = time.monotonic()
    gathered = await gather_trajectory_groups(
        (TrajectoryGroup(rollout(model, s) for _ in range(rollouts_per_group)) for s in chosen),
        pbar_desc="preflight",
        max_exceptions=groups * rollouts_per_group,
        show_progress=show_progress,
    )
    rollout_seconds = time.monotonic() - started
    judged = await _Judged.of(gathered, judge_model, rubric, options)
    return _result(
        gathered,
        judged,
        groups=groups,
        size=rollouts_per_group,
        steps=steps,
        groups_per_step=groups_per_step,
        rollout_seconds=rollout_seconds,
        train_seconds=train_seconds_per_step,
    )


def _check_inputs(
    rollout: Any, scenarios: Sequence[Any], size: Any, groups: Any, steps: Any, per_step: Any
) -> None:
    if not scenarios:
        raise PreflightError("preflight() needs at least one scenario; got none.")
    if not callable(rollout):
        raise PreflightError(
            f"rollout must be an async function (model, scenario); got {rollout!r}"
        )
    for name, value, low in (
        ("rollouts_per_group", size, 2),
        ("groups", groups, 1),
        ("steps", steps, 1),
        ("groups_per_step", per_step, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            why = " (GRPO compares the runs of a group)" if name == "rollouts_per_group" else ""
            raise PreflightError(
                f"preflight(): {name} must be an integer >= {low}{why}; got {value!r}"
            )


@dataclass
class _Judged:
    """Each group's rewards (the judge's mean of both orders, or the rollouts' own), its runs'
    texts and metrics, and what the judge's two orders said about the judge."""

    judge: Model | None
    usage: JudgeUsage = field(default_factory=JudgeUsage)  # the forward order: a step's bill
    seconds: float = 0.0
    rewards: list[list[float]] = field(default_factory=list)
    texts: list[list[str]] = field(default_factory=list)
    metrics: list[list[dict[str, float]]] = field(default_factory=list)
    ties: int = 0
    pairs: int = 0
    gaps: list[float] = field(default_factory=list)
    failures: int = 0

    @classmethod
    async def of(
        cls,
        gathered: list[TrajectoryGroup],
        judge: Model | None,
        rubric: str,
        options: dict[str, Any],
    ) -> _Judged:
        judged = cls(judge)
        for group in gathered:
            runs = list(group.trajectories)
            if not runs:
                continue
            judged.texts.append(
                [json.dumps(judged_messages(t), sort_keys=True, default=str) for t in runs]
            )
            judged.metrics.append([_numbers(t.metrics) for t in runs])
            if judge is None:
                judged.rewards.append([float(t.reward) for t in runs])
            else:
                await judged._judge(runs, judge, rubric, options)
        return judged

    async def _judge(
        self, runs: list[Trajectory], judge: Model, rubric: str, options: dict[str, Any]
    ) -> None:
        """One group, in both orders: its rewards, the ties and the position gaps."""
        texts = self.texts[-1]
        distinct = list(dict.fromkeys(texts))
        lists = [judged_messages(runs[texts.index(key)]) for key in distinct]
        tools = next((t.tools for t in runs if t.tools), None)
        started = time.monotonic()
        try:
            forward = await ruler(lists, judge, rubric, tools, usage=self.usage, **options)
            self.seconds += time.monotonic() - started
            backward = (
                list(reversed(await ruler(lists[::-1], judge, rubric, tools, **options)))
                if len(lists) > 1
                else forward
            )
        except JudgeError:
            self.failures += 1
            self.seconds += time.monotonic() - started
            return
        for order in (forward, backward):
            for i in range(len(order)):
                for j in range(i + 1, len(order)):
                    self.pairs += 1
                    self.ties += abs(order[i].score - order[j].score) < _TIE
        if len(lists) > 1:
            self.gaps += [abs(f.score - b.score) for f, b in zip(forward, backward, strict=True)]
        mean = {
            key: (f.score + b.score) / 2
            for key, f, b in zip(distinct, forward, backward, strict=True)
        }
        self.rewards.append([mean[key] for key in texts])


def _result(
    gathered: list[TrajectoryGroup],
    judged: _Judged,
    *,
    groups: int,
    size: int,
    steps: int,
    groups_per_step: int,
    rollout_seconds: float,
    train_seconds: float | None,
) -> PreflightResult:
    """The measurements scaled to a configured step, the verdict and the change to make."""
    failed = sum(len(g.exceptions) for g in gathered)
    first_error = next((f"{e.type}: {e.message}" for g in gathered for e in g.exceptions), None)
    rewards, texts, usage, gaps = judged.rewards, judged.texts, judged.usage, judged.gaps
    is_judged = judged.judge is not None
    scale = groups_per_step / groups
    rollout_per_step = rollout_seconds * scale
    judge_per_step = judged.seconds * scale
    per_step = rollout_per_step + judge_per_step + (train_seconds or 0.0)
    flat = [_flat(r) for r in rewards]
    everything = [x for r in rewards for x in r]
    numbers: dict[str, Any] = {
        "failed_share": failed / (groups * size),
        "zero_variance_share": sum(flat) / len(rewards) if rewards else 1.0,
        "identical_run_share": (
            sum(len(set(t)) == 1 for t in texts) / len(texts) if texts else 0.0
        ),
        "spread": statistics.fmean(statistics.pstdev(r) for r in rewards) if rewards else 0.0,
        "tie_rate": judged.ties / judged.pairs if is_judged and judged.pairs else None,
        "position_gap": (statistics.fmean(gaps) if gaps else 0.0) if is_judged else None,
    }
    verdict, change, reasons = _verdict(
        numbers, rewards, texts, judged.metrics, is_judged, judged.failures, len(gathered)
    )
    return PreflightResult(
        groups=groups,
        rollouts_per_group=size,
        rollouts=groups * size,
        failed_rollouts=failed,
        zero_variance_share=numbers["zero_variance_share"],
        reward_mean=statistics.fmean(everything) if everything else 0.0,
        reward_min=min(everything, default=0.0),
        reward_max=max(everything, default=0.0),
        reward_spread=numbers["spread"],
        identical_run_share=numbers["identical_run_share"],
        judged=is_judged,
        judge_tie_rate=numbers["tie_rate"],
        judge_position_gap=numbers["position_gap"],
        judge_failures=judged.failures,
        rollout_seconds_per_step=rollout_per_step,
        judge_seconds_per_step=judge_per_step,
        train_seconds_per_step=train_seconds,
        seconds_per_step=per_step,
        judge_tokens_per_step=(usage.prompt_tokens + usage.completion_tokens) * scale,
        judge_cost_usd_per_step=usage.cost_usd * scale,
        steps=steps,
        groups_per_step=groups_per_step,
        expected_wall_seconds=steps * per_step,
        verdict=verdict,
        change=change,
        advice=CHANGES.get(change or "", ""),
        reasons=reasons,
        first_error=first_error,
    )


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _flat(rewards: list[float]) -> bool:
    return len(rewards) < 2 or max(rewards) - min(rewards) < _TIE


def _verdict(
    numbers: dict[str, Any],
    rewards: list[list[float]],
    texts: list[list[str]],
    metrics: list[list[dict[str, float]]],
    judged: bool,
    judge_failures: int,
    group_count: int,
) -> tuple[str, str | None, list[str]]:
    """The verdict, the one change and the reasons, checked in order of what blocks learning."""
    limits = THRESHOLDS
    reasons: list[str] = []
    if numbers["failed_share"] >= limits["failed_rollouts"]:
        reasons.append(f"{numbers['failed_share']:.0%} of rollouts raised")
        return "will not learn: rollouts fail", "fix the rollout", reasons
    if judged and group_count and judge_failures >= max(1, group_count / 2):
        reasons.append(f"the judge could not score {judge_failures} of {group_count} groups")
        return "will not learn: judge fails", "a better judge", reasons
    tie_rate, gap = numbers["tie_rate"], numbers["position_gap"]
    if tie_rate is not None and tie_rate >= limits["judge_tie_rate"]:
        reasons.append(
            f"the judge gave the same score to {tie_rate:.0%} of pairs of different runs "
            f"(limit {limits['judge_tie_rate']:.0%})"
        )
        return "will not learn: judge ties", "a better judge", reasons
    if gap is not None and gap >= limits["judge_position_gap"]:
        reasons.append(
            f"the judge's scores move by {gap:.2f} on average when the order flips "
            f"(limit {limits['judge_position_gap']})"
        )
        return "unlikely to learn: judge position bias", "a better judge", reasons
    zero = numbers["zero_variance_share"]
    flat = [k for k, r in enumerate(rewards) if _flat(r)]
    if zero >= limits["zero_variance_slows"]:
        change = _change_for_flat(flat, rewards, texts, metrics, reasons)
        reasons.insert(0, f"{zero:.0%} of groups have zero reward variance (no gradient)")
        if zero >= limits["zero_variance_blocks"]:
            return "will not learn: zero-variance groups", change, reasons
        return "may learn slowly: many zero-variance groups", change, reasons
    if numbers["spread"] < limits["min_reward_spread"]:
        reasons.append(
            f"rewards inside a group differ by {numbers['spread']:.3f} (std) on average "
            f"(limit {limits['min_reward_spread']})"
        )
        return "may learn slowly: weak reward signal", "a shaped reward", reasons
    reasons.append(
        f"{1 - zero:.0%} of groups have reward differences (spread {numbers['spread']:.3f})"
    )
    return "likely to learn", None, reasons


def _change_for_flat(
    flat: list[int],
    rewards: list[list[float]],
    texts: list[list[str]],
    metrics: list[list[dict[str, float]]],
    reasons: list[str],
) -> str:
    """Which one change would most likely give the flat groups a reward difference."""
    identical = [k for k in flat if len(set(texts[k])) == 1]
    if len(identical) * 2 >= len(flat):
        reasons.append(f"{len(identical)} of {len(flat)} flat groups hold identical runs")
        return "higher temperature"
    varying = sorted(
        {
            name
            for k in flat
            for name in set().union(*(m.keys() for m in metrics[k]))
            if len({m.get(name) for m in metrics[k]}) > 1
        }
    )
    if varying:
        reasons.append(f"metric(s) {', '.join(varying)} differ between runs; the reward does not")
        return "a shaped reward"
    values = {rewards[k][0] for k in flat if rewards[k]}
    everything = [x for r in rewards for x in r]
    if len(flat) < len(rewards):
        # Other groups show the reward does tell runs apart: a larger group is more likely to
        # hold a run that differs (P(flat) falls geometrically with the group size).
        reasons.append("the other groups do differ: the reward can tell runs apart")
        reasons.append(
            "while training, art.GroupSignal(min_trainable_groups=N) samples more scenarios "
            "until a step has N groups with mixed rewards and skips scenarios that stay flat"
        )
        return "larger group"
    if len(values) == 1 and max(everything) <= 0:
        reasons.append(
            f"every run got no reward ({max(everything):.3f}); a success rate below "
            f"1/{len(everything)} is not ruled out: raise `groups` to look harder"
        )
        return "SFT warm start"
    if len(values) > 1:
        reasons.append("flat groups sit at different rewards: the task, not the run, decides")
        return "larger group"
    reasons.append("every run of every group got the same reward, whatever it wrote")
    return "a shaped reward"


# --------------------------------------------------------------------------- `art preflight`
