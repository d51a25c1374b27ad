"""Reviewers' veto over a train step: the hold before it queues, and their decisions applied.

The hold (`held_for_review`): with `config.review_hold_seconds > 0` the submitted groups are
written as a pending step (`store._review_decisions`), shown on `/review` with an "approve now"
button; the request then waits until a person approves it or the hold expires, and only then
queues its training step, which reads the flags and reward overrides in force at that moment.
The approval is a row in the model's decisions file, polled here, so `art review` (another
process, same folder) can approve too. The pending step is forgotten when the step has run (or
the client went away).

The decisions (`apply_review`, called by `_prepared_step.prepare_step` for each group when the
step runs): a flagged group or trajectory is left out, an overridden reward replaces the
submitted one; each is counted under `REVIEW_METRICS` and noted in the trajectory's logged row.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from art_backend.store._checkpoints import ModelStore
from art_backend.store._review_decisions import (
    PENDING,
    PendingStep,
    ReviewState,
    read_review_state,
    remove_pending,
    write_pending,
)
from art_backend.training._step_log import trajectory_rows
from art_core.wire import GroupPayload, TrainRequest, TrajectoryPayload

POLL_SECONDS = 0.25
# Counted in every train step: what reviewers' decisions (review page) left out or changed.
REVIEW_METRICS = ("review/flagged_trajectories", "review/flagged_groups", "review/reward_overrides")


async def held_for_review(
    store: ModelStore, step: int, request: TrainRequest, steps: AsyncIterator[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    """Hold `request` for review, then pass on the events of its training step (`steps`)."""
    hold_seconds = request.config.review_hold_seconds
    rows = trajectory_rows(request.groups)
    pending = await asyncio.to_thread(write_pending, store.dir, step, hold_seconds, rows)
    try:
        yield {
            "type": "review_hold",
            "pending": pending.id,
            "step": step,
            "seconds": hold_seconds,
            "review_path": f"/review/{store.project}/{store.name}/steps/{PENDING}/{pending.id}",
        }
        released = await _until_approved_or_expired(store, pending)
        yield {"type": "review_released", "pending": pending.id, "how": released}
        async for event in steps:
            if event["type"] in ("result", "error"):  # the client may act at once on it
                await asyncio.to_thread(remove_pending, store.dir, pending.id)
            yield event
    finally:
        remove_pending(store.dir, pending.id)  # no await: this also runs when cancelled


async def _until_approved_or_expired(store: ModelStore, pending: PendingStep) -> str:
    deadline = time.monotonic() + (pending.expires_at - pending.held_at)
    while True:
        state = await asyncio.to_thread(read_review_state, store.dir)
        if pending.id in state.approved:
            return "approved"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "expired"
        await asyncio.sleep(min(POLL_SECONDS, remaining))


def apply_review(
    group: GroupPayload, review: ReviewState
) -> tuple[list[tuple[TrajectoryPayload, float]] | None, dict[str, dict[str, Any]]]:
    """The group's trajectories that may train, each with its reward after reviewers' decisions.

    None when the whole group is flagged. The second value is what was applied, by trajectory
    id, as annotations of its logged row.
    """
    group_flag = review.group_flag([t.id for t in group.trajectories])
    if group_flag is not None:
        note = {"review": {"applied": "flagged_groups", "reason": group_flag.get("reason")}}
        return None, {t.id: note for t in group.trajectories}
    members: list[tuple[TrajectoryPayload, float]] = []
    applied: dict[str, dict[str, Any]] = {}
    for trajectory in group.trajectories:
        if (flag := review.trajectory_flag(trajectory.id)) is not None:
            applied[trajectory.id] = {
                "review": {"applied": "flagged_trajectories", "reason": flag.get("reason")}
            }
        elif (override := review.override(trajectory.id)) is not None:
            reward = float(override["reward"])
            applied[trajectory.id] = {
                "reward": reward,
                "review": {
                    "applied": "reward_overrides",
                    "reason": override.get("reason"),
                    "submitted_reward": trajectory.reward,
                },
            }
            members.append((trajectory, reward))
        else:
            members.append((trajectory, trajectory.reward))
    return members, applied
