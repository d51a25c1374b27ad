"""One train step's data, before any model work: a train request read against the records.

`prepare_step` applies reviewers' decisions (`_review_veto.apply_review`: a flagged group or
trajectory is left out, an overridden reward replaces the submitted one), looks up each
trajectory's recorded turns (a turn without a record is dropped and counted), and sums the
groups' metrics; `PreparedStep.set_advantages` gives each trajectory its GRPO advantage from
its group; `PreparedStep.sequences` are what `_rows.pack_rows` turns into token rows.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from art_backend._errors import InvalidRequestError
from art_backend.store._records import CompletionRecords
from art_backend.store._review_decisions import ReviewState
from art_backend.training._grpo import ScaleRewards, advantages_from_rewards, balance_advantages
from art_backend.training._review_veto import REVIEW_METRICS, apply_review
from art_backend.training._rows import (
    RecordedAnswers,
    Sequence,
    TrajectoryTurns,
    build_sequences,
    turns_from_record,
)
from art_backend.training._step_log import finite_metrics, mean_and_std, reward_metrics
from art_core.wire import GroupPayload, TrainRequest, TrajectoryPayload


@dataclass
class RecordedTrajectory:
    """One trajectory that may train: its recorded turns, in call order, and its reward."""

    trajectory_id: str
    group_id: int
    reward: float
    turns: list[Any]


@dataclass
class PreparedStep:
    """A train request read against the records, before any model work.

    `advantages` and `trainable` (one each per trajectory) exist after `set_advantages`.
    """

    trajectories: list[RecordedTrajectory]
    metrics: dict[str, float]
    warnings: list[str]
    annotations: dict[tuple[int, str], dict[str, Any]]  # (group index, trajectory id) -> notes
    advantages: list[float] = field(default_factory=list)
    trainable: list[bool] = field(default_factory=list)

    def set_advantages(self, scale_rewards: ScaleRewards, balance: float = 0.0) -> None:
        """One advantage per trajectory from its group (GRPO), then ART's advantage_balance; a
        group whose rewards are all equal teaches nothing and is counted in `groups/zero_variance`."""
        rewards = torch.tensor([t.reward for t in self.trajectories], dtype=torch.float64)
        group_ids = torch.tensor([t.group_id for t in self.trajectories], dtype=torch.long)
        advantages, trainable = (
            advantages_from_rewards(rewards, group_ids, scale_rewards=scale_rewards)
            if self.trajectories
            else (rewards, rewards.bool())
        )
        advantages = balance_advantages(advantages, balance)
        check_advantages(advantages, scale_rewards)  # reviewers' overrides too
        self.advantages = advantages.tolist()
        self.trainable = trainable.tolist()
        for trajectory, advantage in zip(self.trajectories, self.advantages, strict=True):
            note = self.annotations.setdefault((trajectory.group_id, trajectory.trajectory_id), {})
            note["advantage"] = advantage
        trainable_groups = {
            t.group_id for t, ok in zip(self.trajectories, self.trainable, strict=True) if ok
        }
        groups = {t.group_id for t in self.trajectories}
        self.metrics["groups/zero_variance"] = float(len(groups - trainable_groups))
        self.metrics["groups/trainable"] = float(len(trainable_groups))

    def sequences(self) -> list[Sequence]:
        """The token sequences of the trainable trajectories, each with its advantage."""
        sequences: list[Sequence] = []
        for trajectory, advantage, ok in zip(
            self.trajectories, self.advantages, self.trainable, strict=True
        ):
            if ok:
                sequences += build_sequences(
                    TrajectoryTurns(
                        trajectory.trajectory_id, trajectory.group_id, advantage, trajectory.turns
                    )
                )
        return sequences

    def untrained(self) -> tuple[int, int]:
        """(sampled tokens, sequences) of the trajectories that do not train (all-equal groups):
        what TRL's loss denominators also count."""
        tokens = rows = 0
        for trajectory, ok in zip(self.trajectories, self.trainable, strict=True):
            if not ok:
                for sequence in build_sequences(
                    TrajectoryTurns(trajectory.trajectory_id, trajectory.group_id, 0.0,
                                    trajectory.turns)
                ):  # fmt: skip
                    tokens += int(sequence.trained_mask.sum())
                    rows += 1
        return tokens, rows

    def answer(self, step: int, checkpoint_path: str | None = None) -> dict[str, Any]:
        """The route's answer; each trajectory's advantage goes back (its Langfuse export)."""
        return {
            "step": step,
            "metrics": self.metrics,
            "warnings": self.warnings,
            "advantages": {
                t.trajectory_id: float(a)
                for t, a in zip(self.trajectories, self.advantages, strict=True)
            },
            "checkpoint_path": checkpoint_path,
        }


def prepare_step(
    request: TrainRequest,
    review: ReviewState,
    records: CompletionRecords,
    model_name: str | None = None,
) -> PreparedStep:
    """Recorded turns of every trajectory in groups that can train; the rest counted.

    Reviewers' decisions apply first: a flagged group or trajectory is left out, an
    overridden reward replaces the submitted one (each counted under `review/...` and noted
    in the annotations, keyed by (group index, trajectory id)).
    """
    # Assistant turns without a completion id match recorded completions by text
    # (`RecordedAnswers`): the records are indexed once a step, only when such a turn comes.
    by_text = any(
        ref.message_index is not None
        for group in request.groups
        for trajectory in group.trajectories
        for history in trajectory.histories
        for ref in history.turns
    )
    step = _Preparation(records, RecordedAnswers(records.snapshot()) if by_text else None)
    for group_id, group in enumerate(request.groups):
        step.add_group(group_id, group, review, model_name)
    records.release(step.used)  # trained now: under the record budget, these go first
    metrics = step.metrics()
    for name, value in request.client_metrics.items():
        if math.isfinite(value):
            metrics[name] = metrics.get(name, 0.0) + value
    # Sums of huge group metrics overflow to inf: those are dropped and counted.
    return PreparedStep(step.kept, finite_metrics(metrics), step.warnings(), step.annotations)


@dataclass
class _Preparation:
    """What `prepare_step` gathers group by group: the kept trajectories and the counts."""

    records: CompletionRecords
    answers: RecordedAnswers | None
    counts: Counter[str] = field(default_factory=Counter)
    evicted: Counter[str] = field(default_factory=Counter)  # why records a turn names went
    used: list[str] = field(default_factory=list)  # completion ids whose turns are trained
    rewards: list[float] = field(default_factory=list)
    kept: list[RecordedTrajectory] = field(default_factory=list)
    annotations: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)

    def add_group(
        self, group_id: int, group: GroupPayload, review: ReviewState, model_name: str | None
    ) -> None:
        counts = self.counts
        counts["groups/submitted"] += 1
        counts["exceptions"] += len(group.exceptions)
        for name, value in group.metrics.items():
            if math.isfinite(value):
                counts[name] += value  # type: ignore[assignment]
        for trajectory in group.trajectories:
            # A rollout's own count of what it could not keep (e.g. unused n > 1 choices).
            for name, value in trajectory.metrics.items():
                if name.startswith("dropped/") and math.isfinite(value):
                    counts[name] += value  # type: ignore[assignment]
        members, applied = apply_review(group, review)
        for trajectory_id, note in applied.items():
            self.annotations[(group_id, trajectory_id)] = note
        if members is None:
            counts["review/flagged_groups"] += 1
            return
        for note in applied.values():
            counts[f"review/{note['review']['applied']}"] += 1
        self.rewards += [reward for _, reward in members]
        if len(members) < 2:
            counts["groups/too_small"] += 1
            return
        for trajectory, reward in members:
            counts["trajectories"] += 1
            counts["context_assistant_messages"] += trajectory.context_assistant_messages
            turns = self.turns_of(trajectory, model_name)
            if not turns:
                counts["dropped/no_trainable_turns"] += 1
            self.kept.append(RecordedTrajectory(trajectory.id, group_id, reward, turns))

    def turns_of(self, trajectory: TrajectoryPayload, model_name: str | None) -> list[Any]:
        """The recorded turns a trajectory's references name; what is not found is counted."""
        counts = self.counts
        turns = []
        rollout_id = trajectory.metadata.get("rollout_id")
        for history in trajectory.histories:
            for ref in history.turns:
                if ref.completion_id is None:
                    # Matched by text: TurnRef then names the message (message_index).
                    index = ref.message_index or 0
                    assert self.answers is not None
                    matched = self.answers.find(
                        history.messages[:index],
                        history.messages[index],
                        rollout_id=rollout_id if isinstance(rollout_id, str) else None,
                        model_name=model_name,
                    )
                    if matched is None:
                        counts["dropped/unmatched_assistant_messages"] += 1
                        continue
                    counts["matched_assistant_messages"] += 1
                    turns.append(matched)
                    continue
                record = self.records.get(ref.completion_id)
                if record is None and (why := self.records.eviction_reason(ref.completion_id)):
                    counts["dropped/evicted_completion"] += 1
                    self.evicted[why] += 1
                    continue
                choices = turns_from_record(record) if record else []
                if ref.choice_index >= len(choices):
                    counts["dropped/unknown_completion"] += 1
                    continue
                self.used.append(ref.completion_id)
                turns.append(choices[ref.choice_index])
        return turns

    def warnings(self) -> list[str]:
        """What was not trained and why, in words the user can act on."""
        counts, warnings = self.counts, []
        if self.evicted:
            reasons = "; ".join(f"{count} {why}" for why, count in self.evicted.items())
            warnings.append(
                f"{counts['dropped/evicted_completion']} turn(s) reference completions this "
                f"backend evicted before this step ({reasons}): not trained. Train a group soon "
                "after its rollouts, or keep fewer untrained rollouts in flight."
            )
        if counts["dropped/unknown_completion"]:
            warnings.append(
                f"{counts['dropped/unknown_completion']} turn(s) reference completions this "
                "backend has no record of (served elsewhere, or evicted after an hour): not "
                "trained."
            )
        if counts["dropped/unmatched_assistant_messages"]:
            warnings.append(
                f"{counts['dropped/unmatched_assistant_messages']} assistant message(s) without a "
                "completion id (plain dicts, or choices served elsewhere) match no completion this "
                "backend recorded (the same conversation before it, the same text and tool "
                "calls): context, not trained. Append the choice itself (`response.choices[0]`), "
                "or keep the answer exactly as sampled."
            )
        return warnings

    def metrics(self) -> dict[str, float]:
        """The counts (every drop counter present, 0 when nothing was dropped) and rewards."""
        metrics = {name: float(value) for name, value in self.counts.items()}
        for name in (
            "dropped/unknown_completion",
            "dropped/no_trainable_turns",
            "dropped/unmatched_assistant_messages",
            "dropped/evicted_completion",
            "matched_assistant_messages",
            "groups/too_small",
            *REVIEW_METRICS,
        ):
            metrics.setdefault(name, 0.0)
        metrics.update(reward_metrics(self.rewards))
        return metrics


def check_rewards(groups: list[GroupPayload], scale_rewards: ScaleRewards) -> None:
    """`check_advantages` on the submitted rewards, before the step is queued: a 400 at once,
    not an error event after the queue and any review hold (the step checks its own again).

    Only scale_rewards="none" keeps the rewards' magnitude: its advantage is a reward minus its
    group's mean, checked here from the rewards alone. "group" and "batch" divide by a standard
    deviation, which keeps every advantage under sqrt(trajectories): nothing to check.
    """
    if scale_rewards != "none":
        return
    for group in groups:
        rewards = [trajectory.reward for trajectory in group.trajectories]
        if rewards:
            mean = mean_and_std(rewards)[0]
            farthest = [max(rewards) - mean, min(rewards) - mean]
            check_advantages(torch.tensor(farthest, dtype=torch.float64), scale_rewards)


def check_advantages(advantages: torch.Tensor, scale_rewards: str) -> None:
    """400 when advantages leave float32, the dtype the trainer computes the loss in."""
    if bool(torch.isfinite(advantages.float()).all()):
        return
    raise InvalidRequestError(
        f"These rewards give advantages too large to train on (scale_rewards={scale_rewards!r} "
        'keeps their magnitude). Rescale the rewards, or use scale_rewards "group" or "batch".',
        param="groups",
    )


def why_nothing_trained(metrics: dict[str, float]) -> str:
    reasons = [
        f"{int(value)} {key}"
        for key, value in metrics.items()
        if key.startswith(("dropped/", "groups/", "review/"))
        and value
        and key not in ("groups/submitted", "groups/trainable")
    ]
    return ", ".join(reasons) or "no trajectories"
