"""AutoRL: train from a one-paragraph task description, with no data and no reward code.

    result = await art.autorl("Answer customer emails for a bike shop ...", model, judge=judge)

1. `generate_scenarios` writes inputs from the description; a deterministic split holds some out;
2. each step runs `rollouts_per_group` answers per scenario, RULER scores each group as it
   finishes (a group the judge cannot score is dropped and counted), and the model trains;
3. the held-out scenarios are answered greedily before and after, and scored by the judge one
   answer at a time (an absolute score by the rubric); at the end each held-out scenario's first
   and last answers are also judged side by side, in both orders, for a win rate;
4. the report is the demo's: before/after table, reward curve, examples, settings.

The run's settings (steps, group sizes, held-out share, TrainConfig, report) are one
`RunSettings`, built from the keywords or given as `settings=`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_core._unknown_fields import check_names
from art_core.model import Model, TrainableModel
from art_core.rewards._judge_models import resolve_model
from art_core.rewards._judge_usage import JudgeUsage
from art_core.rewards._ruler_prompt import DEFAULT_RUBRIC
from art_core.rewards._run import (
    AutoRLResult,
    Rollout,
    RunOutcome,
    RunSettings,
    TrainingRun,
    group_scorer,
    judge_answer,
)
from art_core.rewards._scenarios import Scenario, generate_scenarios, split_scenarios
from art_core.rewards.ruler import RULER_OPTIONS, ruler
from art_core.trajectories import Trajectory
from art_core.types import TrainConfig, TrainResult

_DESCRIPTION = (
    "Trained from generated scenarios with RULER rewards ({judge} as judge). Held-out reward is "
    "the judge's absolute score of one greedy answer; win_rate_vs_start compares the last and "
    "first answers side by side. A stronger judge gives better rewards."
)


async def autorl(
    task_description: str,
    model: TrainableModel,
    *,
    judge: Model | str,
    generator: Model | str | None = None,
    steps: int = 10,
    groups_per_step: int = 4,
    rollouts_per_group: int = 4,
    num_scenarios: int = 32,
    val_fraction: float = 0.25,
    scenarios: list[Scenario] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    system_prompt: str | None = None,
    max_tokens: int = 256,
    config: TrainConfig | None = None,
    judge_options: dict[str, Any] | None = None,
    generation_options: dict[str, Any] | None = None,
    report_dir: str | Path | None = None,
    show_progress: bool = True,
    rollout: Rollout | None = None,
    title: str | None = None,
    settings: RunSettings | None = None,
) -> AutoRLResult:
    """Generate inputs, roll out, judge with RULER, train, evaluate held-out; see the module doc.

    `model` must be registered. `generator` defaults to the judge. `scenarios` skips generation.
    `judge_options` go to `ruler` (cache, reverse_order_check, message_char_budget, sampling,
    ...; the judge samples at temperature 0 unless told otherwise); `generation_options` go to
    `generate_scenarios` (sampling, batch_size, concurrency, difficulty, tools, ...).
    `rollout(scenario, temperature)` replaces the one-answer agent (e.g. a tool-using agent);
    its exceptions are kept on their groups (up to 10 percent of a step's rollouts).
    `settings`: the run's settings as one `RunSettings`, instead of the keywords steps,
    groups_per_step, rollouts_per_group, val_fraction, config, report_dir, show_progress, title.
    """
    started = time.monotonic()
    judging = _judging(judge, judge_options, rubric)
    run_settings = RunSettings.given(
        settings, "autorl()", steps=steps, groups_per_step=groups_per_step,
        rollouts_per_group=rollouts_per_group, val_fraction=val_fraction, config=config,
        report_dir=report_dir, show_progress=show_progress, title=title,
    )  # fmt: skip
    if scenarios is None:
        _say(run_settings.show_progress, f"Generating {num_scenarios} scenarios ...")
        options = {"cache": judging.options.get("cache", True), **(generation_options or {})}
        writer = generator or judging.model
        scenarios = await generate_scenarios(
            task_description, num_scenarios, writer, usage=judging.usage, **options
        )
    train, val = _split(scenarios, run_settings.val_fraction)
    run = TrainingRun(
        model,
        rollout or one_answer_agent(model, system_prompt or task_description, max_tokens),
        score_group=group_scorer(
            train, judge=judging.model, usage=judging.usage, rubric=rubric, **judging.options
        ),
        score_answer=judge_answer(judging.model, rubric, judging.usage, **judging.options),
        show_progress=run_settings.show_progress,
        started=started,
    )
    outcome = await run.run(train, val, run_settings)
    return await _judged_result(run, outcome, train, val, task_description, judging, run_settings)


@dataclass(frozen=True)
class _Judging:
    """The judge, the rubric it scores by, its options for `ruler` and its bill."""

    model: Model
    rubric: str
    options: dict[str, Any]
    usage: JudgeUsage


def _judging(judge: Model | str, options: dict[str, Any] | None, rubric: str) -> _Judging:
    """The judge and its options (checked now, not at the first judgement after generation and
    rollouts have been paid for; it samples at temperature 0 unless told)."""
    check_names(
        "autorl(judge_options=...)", options or {}, [n for n in RULER_OPTIONS if n != "usage"]
    )
    options = {"sampling": {"temperature": 0.0}, **(options or {})}
    return _Judging(resolve_model(judge), rubric, options, JudgeUsage())


async def _judged_result(
    run: TrainingRun,
    outcome: RunOutcome,
    train: list[Scenario],
    val: list[Scenario],
    task_description: str,
    judging: _Judging,
    settings: RunSettings,
) -> AutoRLResult:
    """The run's result: the judge's warnings, the win rate of the last answers over the first,
    the settings it reports and the report."""
    warnings = _judge_warnings(outcome.steps, judging.model)
    if run.skipped_steps:
        warnings.append(
            f"{run.skipped_steps} of {settings.steps} steps trained nothing: the judge failed to "
            "score every group of those steps. Check the judge (its URL, key, model) or its "
            "context."
        )
    for warning in warnings:
        run.say(f"Warning: {warning}")
    win_rate = await _win_rate(judging, outcome.first_answers, outcome.last_answers)
    outcome.after.metrics["win_rate_vs_start"] = win_rate
    outcome.before.metrics["win_rate_vs_start"] = 0.5
    judge_name, usage = judging.model.get_inference_name(), judging.usage
    return await run.result(
        outcome,
        train,
        val,
        usage=usage,
        settings={
            "task_description": task_description,
            "judge": judge_name,
            "judge_requests": usage.requests,
            "judge_tokens": usage.prompt_tokens + usage.completion_tokens,
            "judge_cost_usd": round(usage.cost_usd, 4),
            "warnings": " ".join(warnings) or "none",
        },
        report_dir=settings.report_dir,
        title=settings.title or f"AutoRL: {run.model.name}",
        description=f"{task_description.strip()} | {_DESCRIPTION.format(judge=judge_name)}",
        win_rate=win_rate,
        warnings=warnings,
    )


def _split(scenarios: list[Scenario], val_fraction: float) -> tuple[list[Scenario], list[Scenario]]:
    """The deterministic train / held-out split; both sides must have some."""
    train, val = split_scenarios(scenarios, val_fraction)
    if not train or not val:
        raise ValueError(
            f"{len(scenarios)} scenarios split into {len(train)} train / {len(val)} held-out: "
            "raise num_scenarios or change val_fraction so both sides have some."
        )
    return train, val


def one_answer_agent(model: TrainableModel, system: str, max_tokens: int) -> Rollout:
    """The default agent: one chat completion answering the scenario's task."""

    async def answer(scenario: Scenario, temperature: float) -> Trajectory:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": scenario.task},
        ]
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=temperature,
        )
        return Trajectory(
            messages_and_choices=[*messages, response.choices[0]],
            metadata={"scenario": scenario.task, "difficulty": scenario.difficulty},
        )

    return answer


async def _win_rate(judging: _Judging, first: list[Trajectory], last: list[Trajectory]) -> float:
    """How often the judge prefers the last answer to the first (both orders; a tie is half)."""
    options = {**judging.options, "reverse_order_check": True}
    both_ran = [(a, b) for a, b in zip(first, last, strict=True) if a.messages() and b.messages()]
    judge, rubric, usage = judging.model, judging.rubric, judging.usage
    pairs = await asyncio.gather(
        *(
            ruler([a.messages(), b.messages()], judge, rubric, a.tools, usage=usage, **options)
            for a, b in both_ran
        )
    )
    wins = [
        1.0 if after.score > before.score else 0.5 if after.score == before.score else 0.0
        for before, after in pairs
    ]
    return sum(wins) / len(wins) if wins else 0.5


def _judge_warnings(results: list[TrainResult], judge: Model) -> list[str]:
    """Say so when the judge could not tell the runs apart: then nothing trains."""
    submitted = sum(r.metrics.get("groups/submitted", 0) for r in results)
    tied = sum(r.metrics.get("groups/zero_variance", 0) for r in results)
    dropped = sum(r.metrics.get("groups/dropped_before_training", 0) for r in results)
    warnings = []
    if submitted and tied / submitted > 0.5:
        warnings.append(
            f"{judge.get_inference_name()} gave every run the same score in {tied:.0f} of "
            f"{submitted:.0f} groups: GRPO learns nothing from a tied group. Use a stronger "
            "judge, a sharper rubric, or more varied rollouts (temperature)."
        )
    if dropped:
        warnings.append(f"{dropped:.0f} groups were dropped: the judge failed to score them.")
    return warnings


def _say(show: bool, text: str) -> None:
    if show:
        print(text, flush=True)
