"""What reviewers decided, and steps held for review: plain files under a model's folder.

    <project>/models/<name>/review/
        decisions.jsonl            one row per decision, appended, never rewritten
        pending/<id>.json          a step held for review: its step, when it was held, until when
        pending/<id>.jsonl.gz      its submitted groups (the rows of trajectories/<split>/...)

A decision row: `{"at": unix time, "action": ..., "reason": ..., "who": ...}` plus its target.
Actions: `flag_trajectory` and `override_reward` (`trajectory_id`, `reward`), `flag_group`
(`trajectory_ids`: the group's members), `withdraw` (undoes the earlier flags and overrides of
the same target), `approve` (`pending`: releases a held step at once). `source` says where
it was made: `page` (the review page, the default) or `langfuse` (a score or an annotation queue
read back from Langfuse by the client's `LangfuseObserver(review=...)`). The latest row for a
target wins, whatever its source, so the file is the whole audit trail. Only torch-free imports: `art review` reads
these files without loading a model.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REVIEW_FOLDER = "review"
DECISIONS_FILE = "decisions.jsonl"
PENDING_FOLDER = "pending"
# The "split" of steps held for review in URLs (steps named by their pending id): a leading
# "_" is not allowed in split names, so it cannot collide with a logged split.
PENDING = "_pending"
PENDING_ID_PATTERN = re.compile(r"^[0-9a-f]{12}$")

ACTIONS = ("flag_trajectory", "flag_group", "override_reward", "withdraw", "approve")
SOURCES = ("page", "langfuse")  # where a decision was made (`source`; absent: page)


@dataclass
class ReviewState:
    """The decisions in force: the latest row for each target wins."""

    flagged_trajectories: dict[str, dict[str, Any]] = field(default_factory=dict)
    flagged_groups: list[dict[str, Any]] = field(default_factory=list)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    approved: set[str] = field(default_factory=set)

    def trajectory_flag(self, trajectory_id: str) -> dict[str, Any] | None:
        return self.flagged_trajectories.get(trajectory_id)

    def override(self, trajectory_id: str) -> dict[str, Any] | None:
        return self.overrides.get(trajectory_id)

    def group_flag(self, trajectory_ids: list[str]) -> dict[str, Any] | None:
        """The flag of a group sharing any member with these ids (a re-submitted group too)."""
        members = set(trajectory_ids)
        for row in reversed(self.flagged_groups):
            if members & set(row["trajectory_ids"]):
                return row
        return None


def review_dir(model_dir: Path) -> Path:
    return model_dir / REVIEW_FOLDER


def append_decision(model_dir: Path, decision: dict[str, Any]) -> dict[str, Any]:
    """Append one decision with its time; one write call, so concurrent writers never interleave."""
    if decision.get("action") not in ACTIONS:
        raise ValueError(f"unknown review action {decision.get('action')!r}")
    row = {"at": time.time(), **decision}
    folder = review_dir(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    line = json.dumps(row, allow_nan=False) + "\n"
    fd = os.open(folder / DECISIONS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return row


def read_decisions(model_dir: Path) -> list[dict[str, Any]]:
    """Every decision, oldest first; a torn last line (a crash mid-write) is skipped."""
    path = review_dir(model_dir) / DECISIONS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("action") in ACTIONS:
            rows.append(row)
    return rows


def review_state(decisions: list[dict[str, Any]]) -> ReviewState:
    """Replay the decisions in order into the state in force."""
    state = ReviewState()
    for row in decisions:
        action = row["action"]
        if action == "flag_trajectory":
            state.flagged_trajectories[row["trajectory_id"]] = row
        elif action == "override_reward":
            state.overrides[row["trajectory_id"]] = row
        elif action == "flag_group":
            state.flagged_groups.append(row)
        elif action == "approve":
            state.approved.add(row["pending"])
        elif action == "withdraw":
            if "trajectory_id" in row:
                state.flagged_trajectories.pop(row["trajectory_id"], None)
                state.overrides.pop(row["trajectory_id"], None)
            if "trajectory_ids" in row:
                members = set(row["trajectory_ids"])
                state.flagged_groups = [
                    flag
                    for flag in state.flagged_groups
                    if not members & set(flag["trajectory_ids"])
                ]
    return state


def read_review_state(model_dir: Path) -> ReviewState:
    """The decisions in force for one model (empty when nobody reviewed it)."""
    return review_state(read_decisions(model_dir))


# ----------------------------------------------------------------------------- held steps


@dataclass
class PendingStep:
    """A train request held for review before it trains."""

    id: str
    step: int  # the step its rollouts were sampled at (they train into step + 1)
    held_at: float
    expires_at: float
    groups: int
    trajectories: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def write_pending(
    model_dir: Path, step: int, hold_seconds: float, rows: list[dict[str, Any]]
) -> PendingStep:
    """Write a held step's rows, then its description (whose presence marks it pending)."""
    folder = review_dir(model_dir) / PENDING_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    pending = PendingStep(
        id=secrets.token_hex(6),
        step=step,
        held_at=now,
        expires_at=now + hold_seconds,
        groups=len({row["group"] for row in rows}),
        trajectories=sum(1 for row in rows if "exception" not in row),
    )
    with gzip.open(folder / f"{pending.id}.jsonl.gz", "wt", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, default=str) + "\n")
    tmp = folder / f"{pending.id}.json.tmp"
    tmp.write_text(json.dumps(pending.to_json()))
    os.replace(tmp, folder / f"{pending.id}.json")
    return pending


def list_pending(model_dir: Path) -> list[PendingStep]:
    """The steps held now, oldest first."""
    folder = review_dir(model_dir) / PENDING_FOLDER
    if not folder.is_dir():
        return []
    held = []
    for path in folder.glob("*.json"):
        try:
            held.append(PendingStep(**json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError, TypeError):
            continue  # removed or half-written meanwhile
    return sorted(held, key=lambda pending: pending.held_at)


def read_pending(
    model_dir: Path, pending_id: str
) -> tuple[PendingStep, list[dict[str, Any]]] | None:
    """A held step and its rows, or None when it is not (or no longer) held."""
    if not PENDING_ID_PATTERN.fullmatch(pending_id):
        return None
    folder = review_dir(model_dir) / PENDING_FOLDER
    try:
        pending = PendingStep(**json.loads((folder / f"{pending_id}.json").read_text()))
        with gzip.open(folder / f"{pending_id}.jsonl.gz", "rt", encoding="utf-8") as source:
            rows = [json.loads(line) for line in source if line.strip()]
    except (OSError, json.JSONDecodeError, TypeError):
        return None
    return pending, rows


def remove_pending(model_dir: Path, pending_id: str) -> None:
    """The held step trained (or was abandoned): it is no longer pending."""
    folder = review_dir(model_dir) / PENDING_FOLDER
    (folder / f"{pending_id}.json").unlink(missing_ok=True)
    (folder / f"{pending_id}.jsonl.gz").unlink(missing_ok=True)


def remove_all_pending(model_dir: Path) -> int:
    """Forget holds left by a server that stopped mid-hold; returns how many."""
    held = list_pending(model_dir)
    for pending in held:
        remove_pending(model_dir, pending.id)
    return len(held)
