"""The learning curve's contenders and what they show over several seeds.

Contenders beside TRL (each one run per seed, after TRL, on the same split and order):

* `ours`: our trainer in `--dtype` (float32 by default, TRL's dtype): the per-step parity run,
  the same objective on the same rows as TRL's.
* `ours_auto`: the same with `--dtype auto` (the faster dtype by measurement on this CPU).
* `ours_trl_denominator`: `ours` with `TrainConfig(zero_variance_in_denominator=True)`: the
  loss divided by every sampled token of the step, all-equal groups included, as TRL's is.
* `ours_signal`: `auto` plus `art.GroupSignal(min_trainable_groups, max_groups_per_step)`: the
  step samples more scenarios while fewer than N groups have mixed rewards, and scenarios whose
  last group was all-equal are skipped on their next turns.

Over seeds: for each evaluation step, the held-out reward's mean and range per contender; for
each of ours, the median of the per-seed time ratios (time to TRL's final held-out reward over
TRL's time, a seed not reaching it counting as the largest).
"""

from __future__ import annotations

import statistics
from typing import Any

CONTENDERS = ("ours", "ours_auto", "ours_signal", "ours_trl_denominator")


def contender_settings(name: str, dtype: str, signal: dict[str, Any]) -> dict[str, Any]:
    """our_curve's `dtype`, `signal` and TrainConfig options for a contender."""
    if name == "ours":
        return {"dtype": dtype, "signal": None}
    if name == "ours_auto":
        return {"dtype": "auto", "signal": None}
    if name == "ours_signal":
        return {"dtype": "auto", "signal": signal}
    if name == "ours_trl_denominator":  # `ours` with TRL's loss denominator (all-equal groups in)
        return {"dtype": dtype, "signal": None, "train": {"zero_variance_in_denominator": True}}
    raise SystemExit(f"unknown contender {name!r}: choose from {', '.join(CONTENDERS)}")


def median_ratio(ratios: list[float | None]) -> float | None:
    """The median over seeds; a seed whose crossing was not reached counts as the largest."""
    ordered = sorted(ratios, key=lambda r: float("inf") if r is None else r)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return None if low is None or high is None else (low + high) / 2


def over_seeds(seeds: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per-step mean/min/max of the held-out reward per contender (and TRL), median ratios."""
    curves = {"trl": [run["trl_points"] for run in seeds]}
    curves.update({name: [run["contenders"][name]["points"] for run in seeds] for name in names})
    steps = sorted({p["step"] for run in seeds for p in run["trl_points"]})
    per_step: dict[str, dict[str, dict[str, float]]] = {}
    for name, runs in curves.items():
        per_step[name] = {}
        for step in steps:
            # The last evaluation at that step (a batch with no group to train keeps the step).
            at_step = [{p["step"]: p["heldout_reward"] for p in points} for points in runs]
            values = [rewards[step] for rewards in at_step if step in rewards]
            if len(values) == len(runs):
                per_step[name][str(step)] = {
                    "mean": statistics.fmean(values),
                    "min": min(values),
                    "max": max(values),
                }
    ratios = {name: [run["contenders"][name]["time_ratio"] for run in seeds] for name in names}
    return {
        "steps": steps,
        "per_step": per_step,
        "time_ratios": ratios,
        "median_time_ratio": {name: median_ratio(r) for name, r in ratios.items()},
        "within_trl_spread": {
            name: {
                str(step): per_step[name][str(step)]["mean"] >= per_step["trl"][str(step)]["min"]
                for step in steps
                if str(step) in per_step[name] and str(step) in per_step["trl"]
            }
            for name in names
        },
    }


def markdown(result: dict[str, Any], target: float) -> str:
    """The over-seeds tables, or "" for a single seed."""
    summary = result.get("over_seeds")
    if not summary or len(result.get("seeds", [])) < 2:
        return ""
    names = [name for name in summary["per_step"] if name != "trl"]
    seeds = [run["seed"] for run in result["seeds"]]

    def cell(name: str, step: int) -> str:
        stats = summary["per_step"][name].get(str(step))
        if stats is None:
            return "-"
        return f"{stats['mean']:.3f} ({stats['min']:.3f}-{stats['max']:.3f})"

    header = "| step | TRL | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names)
    rows = "\n".join(
        f"| {step} | {cell('trl', step)} | " + " | ".join(cell(n, step) for n in names) + " |"
        for step in summary["steps"]
    )

    def ratio(value: float | None) -> str:
        return "not reached" if value is None else f"{value:.2f}x"

    ratio_rows = "\n".join(
        f"| {name} | "
        + " | ".join(ratio(r) for r in summary["time_ratios"][name])
        + f" | **{ratio(summary['median_time_ratio'][name])}** |"
        for name in names
    )
    loads = "; ".join(
        f"seed {run['seed']}: TRL {run['other_load_cores']['trl']:.2f}, "
        + ", ".join(f"{name} {run['contenders'][name]['other_load_cores']:.2f}" for name in names)
        for run in result["seeds"]
    )
    return f"""
Over {len(seeds)} seeds ({", ".join(map(str, seeds))}; each a different split of the questions,
every contender one run per seed, side by side): held-out reward at each evaluation step, mean
(min-max). `ours` is float32 like TRL (the per-step parity run); `ours_auto` picks its dtype by
measurement; `ours_signal` adds `art.GroupSignal`.

{header}
{rows}

Time to TRL's final held-out reward, as a fraction of TRL's time (target <= {target}):

| contender | {" | ".join(f"seed {s}" for s in seeds)} | median |
|---|{"---|" * len(seeds)}---|
{ratio_rows}

Other load (cores used outside the benchmark during each run): {loads}.
"""
