"""Trajectories as token rows: the server's records of their completions, turn by turn.

One row per recorded assistant turn, in Tinker's datum layout: the input is the prompt and the
sampled tokens but the last, each target the next token. A reinforcement row carries the
sampled log-probabilities and the trajectory's advantage on its sampled tokens (zeros on the
prompt: no gradient there); a supervised row carries weight 1 on its sampled tokens. A turn
the server holds no record of (a plain-dict message, or a record evicted) is not trained, and
counted. `policy_version` is the step of the served adapter that sampled the turn
(`<name>@<step>`), where the record names one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from art_core.trajectories import Trajectory, TrajectoryGroup, trajectory_payload

__all__ = ["group_advantages", "rl_rows", "sft_rows", "turn_datum"]

SERVED_STEP = re.compile(r"@(\d+)$")


class RecordSource(Protocol):
    """A backend that can look its server's completion records up (RemoteBackend)."""

    async def _request(self, method: str, path: str, body: Any = None) -> Any: ...


def turn_datum(
    prompt: list[int], completion: list[int], logprobs: list[float], advantage: float
) -> dict[str, Any]:
    """One recorded turn as a Tinker datum's parts: the input is prompt + completion but its
    last token; every target after the prompt carries its sampled logprob and the advantage,
    the prompt's targets carry zeros (no gradient)."""
    if len(logprobs) != len(completion) or not prompt or not completion:
        raise ValueError("a turn needs a prompt, sampled tokens and one logprob per token")
    tokens = prompt + completion
    context = len(prompt) - 1
    return {
        "input": tokens[:-1],
        "target_tokens": tokens[1:],
        "logprobs": [0.0] * context + [float(value) for value in logprobs],
        "advantages": [0.0] * context + [float(advantage)] * len(completion),
    }


def group_advantages(rewards: list[float], normalize: bool) -> list[float] | None:
    """ART's advantages of one group; None when its rewards are all equal (nothing to learn)."""
    mean = sum(rewards) / len(rewards)
    spread = math.sqrt(sum((reward - mean) ** 2 for reward in rewards) / len(rewards))
    if spread < 1e-8:
        return None
    return [(reward - mean) / (spread if normalize else 1.0) for reward in rewards]


def _turns(trajectory: Trajectory, last_only: bool = False) -> Iterable[tuple[str | None, int]]:
    """The trajectory's assistant turns: (completion id or None, choice index)."""
    for history in trajectory_payload(trajectory).histories:
        turns = history.turns[-1:] if last_only else history.turns
        for turn in turns:
            yield turn.completion_id, turn.choice_index


async def _records(backend: RecordSource, ids: set[str]) -> dict[str, dict[str, Any]]:
    if not ids:
        return {}
    found = await backend._request("POST", "/v1/chat/completions/lookup", {"ids": sorted(ids)})
    return {record["id"]: record for record in found["data"]}


def _choice(record: dict[str, Any], index: int) -> dict[str, Any] | None:
    return next((c for c in record.get("choices", []) if c["index"] == index), None)


def _policy_version(record: dict[str, Any]) -> int | None:
    match = SERVED_STEP.search(str(record.get("model", "")))
    return int(match[1]) if match else None


async def rl_rows(
    backend: RecordSource, groups: Sequence[TrajectoryGroup], normalize: bool
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The groups' recorded turns as reinforcement rows, and the counts of what was left out
    (a group whose rewards are all equal teaches nothing; a turn without a record)."""
    wanted: list[tuple[str, int, float]] = []  # completion id, choice, advantage
    skipped_groups = unrecorded = 0
    for group in groups:
        trajectories = list(group)
        advantages = group_advantages([t.reward for t in trajectories], normalize)
        if advantages is None:
            skipped_groups += 1
            continue
        for trajectory, advantage in zip(trajectories, advantages, strict=True):
            for completion_id, index in _turns(trajectory):
                if completion_id is None:
                    unrecorded += 1
                else:
                    wanted.append((completion_id, index, advantage))
    records = await _records(backend, {completion_id for completion_id, _, _ in wanted})
    rows = []
    for completion_id, index, advantage in wanted:
        record = records.get(completion_id, {})
        choice = _choice(record, index)
        if choice is None:  # evicted, or a choice the record does not hold
            unrecorded += 1
            continue
        if not choice["token_ids"]:
            continue  # nothing sampled (max_tokens 0): nothing to train
        prompt = choice.get("prompt_token_ids", record["prompt_token_ids"])
        row = turn_datum(prompt, choice["token_ids"], choice["logprobs"], advantage)
        row["policy_version"] = _policy_version(record)
        rows.append(row)
    metrics = {
        "data/step_num_groups_submitted": float(len(groups)),
        "data/step_num_groups_trainable": float(len(groups) - skipped_groups),
        "data/step_turns_not_recorded": float(unrecorded),
    }
    return rows, metrics


async def sft_rows(
    backend: RecordSource, trajectories: Sequence[Trajectory], last_only: bool
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The trajectories' recorded assistant turns (all, or each history's last) as supervised
    rows: weight 1 on the sampled tokens, 0 on the prompt."""
    wanted = []
    unrecorded = 0
    for trajectory in trajectories:
        for completion_id, index in _turns(trajectory, last_only):
            if completion_id is None:
                unrecorded += 1
            else:
                wanted.append((completion_id, index))
    records = await _records(backend, {completion_id for completion_id, _ in wanted})
    rows = []
    for completion_id, index in wanted:
        record = records.get(completion_id, {})
        choice = _choice(record, index)
        if choice is None or not choice["token_ids"]:
            unrecorded += choice is None
            continue
        prompt = choice.get("prompt_token_ids", record["prompt_token_ids"])
        tokens = prompt + choice["token_ids"]
        rows.append(
            {
                "input": tokens[:-1],
                "target_tokens": tokens[1:],
                "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(choice["token_ids"]),
                "policy_version": _policy_version(record),
            }
        )
    metrics = {
        "data/step_num_trajectories": float(len(trajectories)),
        "data/step_turns_not_recorded": float(unrecorded),
    }
    return rows, metrics
