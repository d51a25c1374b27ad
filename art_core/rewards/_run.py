"""One training run, as AutoRL and `art_mcp.train` run it: the loop written once.

    run = TrainingRun(model, rollout, score_group=..., score_answer=...)
    outcome = await run.run(train, val, RunSettings(steps=10, groups_per_step=4))

`RunSettings` is the run's settings as one object: AutoRL and `art_mcp.train` build it from their
keywords (or take it as `settings=`) and hand it down whole.

The held-out scenarios are answered greedily and scored one answer at a time (`score_answer`:
code checks, or the judge's absolute score), before and after; an optional warm start (SFT)
runs in between, with its own evaluation. Each step runs `rollouts_per_group` rollouts per
scenario at temperature 1, scores each group as it finishes (`score_group`: code, RULER, or
both; a group it returns None for is dropped and counted) and trains through
`backend.train(model, groups, config=...)`, ART's path; each trajectory carries
`metadata["scenario_sha256"]` (`art_core.utils.scenario_hash`) for the step's replay manifest,
and a RULER-scored one its `judge_cache_key`. A rollout that raises stays an
exception on its group (up to 10 percent of a step's), a held-out one scores 0 and is counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from art_core._unknown_fields import check_names
from art_core.gather import gather_trajectory_groups
from art_core.model import Model, TrainableModel
from art_core.report import Evaluation, summarize, write_report
from art_core.rewards._judge_usage import JudgeUsage
from art_core.rewards._scenarios import Scenario
from art_core.rewards.ruler import ruler, ruler_score_group
from art_core.trajectories import Trajectory, TrajectoryGroup
from art_core.types import TrainConfig, TrainResult
from art_core.utils._hashes import scenario_hash
from art_core.utils._loops import iterate_dataset

Rollout = Callable[[Scenario, float], Awaitable[Trajectory]]  # (scenario, temperature)
GroupScorer = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None]]
AnswerScorer = Callable[[Scenario, Trajectory], Awaitable[None]]  # sets the reward
CodeReward = Callable[[Scenario, Trajectory], Awaitable[None]]  # sets the reward from checks
WarmStart = Callable[[], Awaitable[Mapping[str, Any]]]  # runs it; returns its settings


@dataclass(frozen=True)
class RunSettings:
    """How a training run goes (`art.autorl`, `art_mcp.train`, `TrainingRun.run`).

    `steps` steps of `groups_per_step` scenarios x `rollouts_per_group` rollouts, each trained
    with `config` (None: `TrainConfig()`); `val_fraction` of the scenarios held out;
    `max_minutes`: no step starts that would end, with the final evaluation, past it;
    `report_dir`: the demo's report is written there, titled `title` (None: the caller's);
    `show_progress`: progress lines.
    """

    steps: int = 10
    groups_per_step: int = 4
    rollouts_per_group: int = 4
    val_fraction: float = 0.25
    config: TrainConfig | None = None
    max_minutes: float | None = None
    report_dir: str | Path | None = None
    title: str | None = None
    show_progress: bool = True

    @classmethod
    def given(cls, settings: RunSettings | None, owner: str, **keywords: Any) -> RunSettings:
        """`settings`, or the settings `owner`'s keywords name; not both (a keyword left at its
        default names nothing)."""
        check_names(owner, keywords, [f.name for f in fields(cls)])
        if settings is None:
            return cls(**keywords)
        defaults = cls()
        if changed := [
            name for name, value in keywords.items() if value != getattr(defaults, name)
        ]:
            raise ValueError(
                f"{owner}: pass the run settings either as settings=RunSettings(...) or as "
                f"keywords, not both (got settings= and {', '.join(changed)})."
            )
        return settings


def group_scorer(
    scenarios: list[Scenario],
    *,
    code: CodeReward | None = None,
    judge: Model | None = None,
    usage: JudgeUsage | None = None,
    **judge_options: Any,
) -> GroupScorer:
    """How a step's groups are scored: by code, by RULER (`judge`), or both (their mean; the
    code's reward stays in `metrics["code_reward"]`). A group finds its scenario by the task in
    its metadata, as `TrainingRun.train` puts it there."""
    if code is None and judge is None:
        raise ValueError("group_scorer(): give code=, judge= or both")
    by_task = {s.task: s for s in scenarios}

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if code is not None:
            scenario = by_task[str(group.metadata["scenario"])]
            for trajectory in group.trajectories:
                await code(scenario, trajectory)
        if judge is None:
            return group
        judged = await ruler_score_group(
            group, judge, swallow_exceptions=True, usage=usage, **judge_options
        )
        if judged is not None and code is not None:
            for trajectory in judged.trajectories:
                from_code = float(trajectory.metrics.get("independent_reward", 0.0))
                trajectory.metrics["code_reward"] = from_code
                trajectory.reward = (from_code + trajectory.reward) / 2
        return judged

    return score


def judge_answer(
    judge: Model, rubric: str, usage: JudgeUsage, **judge_options: Any
) -> AnswerScorer:
    """A held-out answer scored alone by the judge: its absolute score by the rubric."""

    async def score(scenario: Scenario, trajectory: Trajectory) -> None:
        [judged] = await ruler(
            [trajectory.messages()], judge, rubric, trajectory.tools, usage=usage, **judge_options
        )
        trajectory.reward = judged.score
        trajectory.logs.append(f"RULER: {judged.explanation}")

    return score


@dataclass
class AutoRLResult:
    """What an AutoRL run did: the held-out evaluations, the steps, the judge's bill, the report."""

    before: Evaluation
    after: Evaluation
    steps: list[TrainResult]
    train_scenarios: list[Scenario]
    val_scenarios: list[Scenario]
    judge_usage: JudgeUsage
    win_rate: float | None = None
    report: Path | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class RunOutcome:
    """What `TrainingRun.run` did: the evaluations and answers around the steps."""

    before: Evaluation
    after: Evaluation
    steps: list[TrainResult]
    first_answers: list[Trajectory]
    last_answers: list[Trajectory]
    settings: dict[str, Any]
    minutes: float


@dataclass
class TrainingRun:
    """A model, its rollout, how groups and held-out answers are scored, and how it reports."""

    model: TrainableModel
    rollout: Rollout
    score_group: GroupScorer
    score_answer: AnswerScorer
    show_progress: bool = True
    # Per-answer metrics summarised beside the held-out reward (e.g. "answer_correct").
    columns: tuple[str, ...] = ()
    describe: Callable[[Trajectory], str] = field(default_factory=lambda: final_text)
    started: float = field(default_factory=time.monotonic)
    # Steps with nothing left to train (the scorer dropped every group): counted, not sent.
    skipped_steps: int = 0

    async def run(
        self,
        train: list[Scenario],
        val: list[Scenario],
        settings: RunSettings | None = None,
        *,
        warm_start: WarmStart | None = None,
        **keywords: Any,
    ) -> RunOutcome:
        """Evaluate, warm-start (and evaluate), train `settings.steps` steps, evaluate; no step
        starts that would end, with the final evaluation, past `settings.max_minutes`.
        `keywords`: RunSettings' fields, instead of `settings`."""
        settings = RunSettings.given(settings, "TrainingRun.run()", **keywords)
        started = time.monotonic()
        self.say(f"Held-out evaluation at step {self.model.step} ({len(val)} scenarios) ...")
        before, first_answers = await self.evaluate(val)
        eval_seconds = time.monotonic() - started
        self.say(f"  held-out reward {before.metrics['reward']:.3f}")
        config = settings.config or TrainConfig()
        reported: dict[str, Any] = {
            "steps": settings.steps,
            "groups_per_step": settings.groups_per_step,
            "rollouts_per_group": settings.rollouts_per_group,
            "scenarios": f"{len(train)} train / {len(val)} held-out",
            "learning_rate": config.learning_rate,
        }
        if warm_start is not None:
            self.say("Warm start: supervised steps on the demonstrations ...")
            reported.update(await warm_start())
            warm, _ = await self.evaluate(val)
            reported["held_out_after_sft"] = round(warm.metrics["reward"], 3)
            self.say(f"  held-out reward after the warm start {warm.metrics['reward']:.3f}")
        minutes = settings.max_minutes
        results = await self.train(
            train,
            steps=settings.steps,
            groups_per_step=settings.groups_per_step,
            rollouts_per_group=settings.rollouts_per_group,
            config=config,
            deadline=started + minutes * 60 if minutes is not None else None,
            eval_seconds=eval_seconds,
        )
        reported["skipped_steps"] = self.skipped_steps
        self.say(f"Held-out evaluation at step {self.model.step} ...")
        after, last_answers = await self.evaluate(val)
        took = (time.monotonic() - started) / 60
        return RunOutcome(before, after, results, first_answers, last_answers, reported, took)

    async def evaluate(self, val: list[Scenario]) -> tuple[Evaluation, list[Trajectory]]:
        """Answer each held-out scenario greedily, score each answer alone, log them as `val`."""
        outcomes = await asyncio.gather(
            *(self.rollout(s, 0.0) for s in val), return_exceptions=True
        )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if len(failed) == len(outcomes):
            raise failed[0]
        answers = [
            Trajectory(messages_and_choices=[], logs=[f"{type(o).__name__}: {o}"])
            if isinstance(o, BaseException)
            else o
            for o in outcomes
        ]
        ran = [(s, t) for s, t in zip(val, answers, strict=True) if t.messages_and_choices]
        await asyncio.gather(*(self.score_answer(s, t) for s, t in ran))
        await self.model.log([TrajectoryGroup(t for _, t in ran)], split="val")
        evaluation = summarize(
            self.model.step,
            [t.reward for t in answers],
            **{name: [float(t.metrics.get(name, 0.0)) for t in answers] for name in self.columns},
        )
        evaluation.metrics["failed_rollouts"] = float(len(failed))
        evaluation.examples = [
            {"prompt": s.task, "answer": self.describe(t), "reward": t.reward}
            for s, t in list(zip(val, answers, strict=True))[:12]
        ]
        return evaluation, answers

    async def train(
        self,
        train: list[Scenario],
        *,
        steps: int,
        groups_per_step: int,
        rollouts_per_group: int,
        config: TrainConfig,
        deadline: float | None = None,
        eval_seconds: float = 0.0,
    ) -> list[TrainResult]:
        """`steps` GRPO steps (fewer when the next, as long as the last, and the final
        evaluation would end past `deadline`); a group is scored as soon as it finishes. A step
        whose groups the scorer all dropped trains nothing: it is counted in `skipped_steps`."""
        results: list[TrainResult] = []
        step_seconds = 0.0
        batches = iterate_dataset(
            train, groups_per_step, num_epochs=1_000, initial_step=self.model.step, use_tqdm=False
        )
        for attempt, batch in enumerate(batches):
            if attempt >= steps:
                break
            needed = step_seconds + eval_seconds  # the next step, as long as the last, and the end
            if deadline is not None and attempt and time.monotonic() + needed > deadline:
                self.say(f"Time is up after {attempt} steps (max_minutes).")
                break
            step_started = time.monotonic()
            groups = await gather_trajectory_groups(
                (
                    TrajectoryGroup(
                        (self._hashed_rollout(s) for _ in range(rollouts_per_group)),
                        metadata={"scenario": s.task},
                    )
                    for s in batch.items
                ),
                pbar_desc=f"step {attempt + 1}/{steps}" if self.show_progress else None,
                max_exceptions=0.1,
                after_each=self.score_group,
            )
            step_seconds = time.monotonic() - step_started
            if not groups:
                self.skipped_steps += 1
                self.say(
                    f"  step {attempt + 1}/{steps} skipped: the scorer dropped all "
                    f"{len(batch.items)} groups (nothing to train on)"
                )
                continue
            result = await self.model.backend.train(self.model, groups, config=config)
            results.append(result)
            step_seconds = time.monotonic() - step_started
            metrics = result.metrics
            self.say(
                f"  step {result.step}: reward {metrics.get('reward', 0):.3f}, trainable groups "
                f"{metrics.get('groups/trainable', 0):.0f}/{metrics.get('groups/submitted', 0):.0f}"
                f", dropped by the scorer {metrics.get('groups/dropped_before_training', 0):.0f}"
            )
        return results

    async def _hashed_rollout(self, scenario: Scenario) -> Trajectory:
        """A training rollout at temperature 1, naming its scenario for the replay manifest."""
        trajectory = await self.rollout(scenario, 1.0)
        trajectory.metadata.setdefault("scenario_sha256", scenario_hash(scenario))
        return trajectory

    async def result(
        self,
        outcome: RunOutcome,
        train: list[Scenario],
        val: list[Scenario],
        *,
        usage: JudgeUsage,
        settings: Mapping[str, Any],
        report_dir: str | Path | None,
        title: str,
        description: str,
        win_rate: float | None = None,
        warnings: Sequence[str] = (),
    ) -> AutoRLResult:
        """The run's result, its settings (the caller's, the run's, the time) and its report
        (the demo's, when `report_dir` is given)."""
        trained = sum(1 for r in outcome.steps if r.metrics.get("groups/trainable", 0) > 0)
        settings = {
            "base_model": self.model.base_model,
            **settings,
            **outcome.settings,
            # A step with no group to learn from leaves the model as it was.
            "trained_steps": trained,
            "minutes": round((time.monotonic() - self.started) / 60, 1),
        }
        report = None
        if report_dir is not None:
            report = write_report(
                Path(report_dir),
                title=title,
                description=description,
                before=outcome.before,
                after=outcome.after,
                history=await self.model.backend.history(self.model),
                settings=settings,
            )
        return AutoRLResult(
            outcome.before, outcome.after, outcome.steps, train, val, usage, win_rate, report,
            settings, list(warnings),
        )  # fmt: skip

    def say(self, text: str) -> None:
        """A progress line, stamped with the minutes since the run began."""
        if self.show_progress:
            elapsed = int(time.monotonic() - self.started)
            print(f"[{elapsed // 60}:{elapsed % 60:02d}] {text}", flush=True)


def final_text(trajectory: Trajectory) -> str:
    """What a run ended with: the last message's text, its tool calls, or the failure."""
    messages = trajectory.messages()
    if not messages:
        return "; ".join(trajectory.logs) or "(no messages)"
    last = messages[-1]
    calls = [
        f"{c['function']['name']}({c['function']['arguments']})"
        for c in last.get("tool_calls") or []
    ]
    return " ".join([last.get("content") or "", *calls]).strip()
