"""The review page's view of the on-disk store: models, steps, groups, trajectories.

Reads what the trainer wrote (`_checkpoints.ModelStore`: history and trajectory files) and what
reviewers decided (`store._review_decisions`), never anything in memory, so the same code serves the
review page of a running `art-server` and of `art review` over a copied `.art` folder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_backend._errors import BackendError, StoreFileDamagedError, StoreNotFoundError
from art_backend._unicode import replace_lone_surrogates
from art_backend.store._checkpoints import ModelStore, TrajectoryFile, read_trajectory_file
from art_backend.store._review_decisions import (
    PENDING,
    PendingStep,
    ReviewState,
    list_pending,
    read_decisions,
    read_pending,
    review_state,
)
from art_core.names import is_name, is_split

# ----------------------------------------------------------------------------------- models


@dataclass
class ModelSummary:
    project: str
    name: str
    step: int | None  # the latest complete checkpoint
    train_steps: int
    last_reward: float | None
    pending: int
    decisions: int


def list_models(root: Path) -> list[ModelSummary]:
    """Every model under `<root>/<project>/models/<name>/`, by project then name."""
    summaries = []
    for model_dir in sorted(root.glob("*/models/*")):
        project, name = model_dir.parent.parent.name, model_dir.name
        if not model_dir.is_dir() or not (is_name(project) and is_name(name)):
            continue
        try:
            store = ModelStore(root, project, name)
        except BackendError:  # a name with '..', or a folder that links outside the root
            continue
        train_rows = [row for row in store.read_history() if row.get("type") == "train"]
        summaries.append(
            ModelSummary(
                project=project,
                name=name,
                step=store.latest_step(),
                train_steps=len(train_rows),
                last_reward=train_rows[-1]["metrics"].get("reward") if train_rows else None,
                pending=len(list_pending(model_dir)),
                decisions=len(read_decisions(model_dir)),
            )
        )
    return summaries


def open_model(root: Path, project: str, name: str) -> ModelStore:
    """The store of one model, or a 404 that lists the models there are."""
    valid = is_name(project) and is_name(name)
    if valid and (root / project / "models" / name).is_dir():
        return ModelStore(root, project, name)  # a folder linking outside the root: a 400
    known = [f"{m.project}/{m.name}" for m in list_models(root)]
    raise StoreNotFoundError(
        f"No model {project}/{name} under {root}: "
        + (f"the models there are {', '.join(known)}." if known else "it holds no models yet.")
    )


# ------------------------------------------------------------------------------------ steps


@dataclass
class StepEntry:
    """A file of logged trajectories, with the history row of the same step."""

    split: str
    step: int
    metrics: dict[str, float]


def list_steps(store: ModelStore) -> list[StepEntry]:
    """Logged steps of every split, by split then step.

    A train file `<step>` holds the rollouts sampled at `step`; they trained into `step + 1`,
    whose history row holds the metrics.
    """
    history = store.read_history()
    train_metrics = {
        row["step"] - 1: row["metrics"] for row in history if row.get("type") == "train"
    }
    log_metrics = {
        (row.get("split"), row["step"]): row["metrics"]
        for row in history
        if row.get("type") == "log"
    }
    return [
        StepEntry(
            split,
            step,
            train_metrics.get(step, {}) if split == "train" else log_metrics.get((split, step), {}),
        )
        for split, step, _ in store.trajectory_files()
    ]


@dataclass
class TrajectoryView:
    """One logged trajectory with the reviewers' decisions in force on it."""

    row: dict[str, Any]
    group: int
    flag: dict[str, Any] | None = None
    override: dict[str, Any] | None = None
    group_flag: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        # A lone surrogate in an id logged before they were refused becomes U+FFFD, so that the
        # page's link to the trajectory finds it again.
        return replace_lone_surrogates(str(self.row["id"]))

    @property
    def logged_reward(self) -> float:
        return float(self.row.get("reward", 0.0))

    @property
    def reward(self) -> float:
        """The reward in force: a reviewer's override, else the logged one."""
        return float(self.override["reward"]) if self.override else self.logged_reward

    @property
    def advantage(self) -> float | None:
        value = self.row.get("advantage")
        return float(value) if isinstance(value, int | float) else None

    @property
    def flagged(self) -> bool:
        return self.flag is not None or self.group_flag is not None

    def messages(self) -> list[dict[str, Any]]:
        return [m for history in self.row.get("histories", []) for m in history.get("messages", [])]

    def text(self) -> str:
        """Everything searchable: message text, tool calls, logs."""
        parts = [message_text(m) for m in self.messages()]
        parts += [str(line) for line in self.row.get("logs", [])]
        return "\n".join(parts)


@dataclass
class GroupView:
    index: int
    trajectories: list[TrajectoryView]  # by reward in force, best first
    exceptions: list[str]
    flag: dict[str, Any] | None = None

    @property
    def member_ids(self) -> list[str]:
        return [t.id for t in self.trajectories]


@dataclass
class StepView:
    split: str
    step: str  # a number, or a pending id
    groups: list[GroupView]
    metrics: dict[str, float] = field(default_factory=dict)
    pending: PendingStep | None = None
    pending_state: str = ""  # holding, approved, expired
    damage: str = ""  # what could not be read from a damaged trajectories file (shown)

    @property
    def label(self) -> str:
        if self.pending is not None:
            return f"pending step (sampled at step {self.pending.step})"
        return f"{self.split} step {int(self.step)}"

    def group(self, index: str) -> GroupView:
        for group in self.groups:
            if str(group.index) == index:
                return group
        raise StoreNotFoundError(
            f"No group {index!r} in {self.label}: it has groups "
            f"{', '.join(str(g.index) for g in self.groups) or 'none'}."
        )

    def trajectory(self, trajectory_id: str) -> TrajectoryView:
        for group in self.groups:
            for trajectory in group.trajectories:
                if trajectory.id == trajectory_id:
                    return trajectory
        raise StoreNotFoundError(f"No trajectory {trajectory_id!r} in {self.label}.")


def load_step(store: ModelStore, split: str, step: str, state: ReviewState) -> StepView:
    """A logged (or held) step's groups, with the decisions in force; 404 naming what exists."""
    if split == PENDING:
        held = read_pending(store.dir, step)
        if held is None:
            raise StoreNotFoundError(
                f"No step {step!r} is held for review on {store.project}/{store.name}: it was "
                "approved and trained, its hold expired, or it never existed."
            )
        pending, rows = held
        view = StepView(PENDING, step, build_groups(rows, state), pending=pending)
        view.pending_state = (
            "approved"
            if pending.id in state.approved
            else ("expired" if time.time() >= pending.expires_at else "holding")
        )
        return view
    entries = [e for e in list_steps(store) if e.split == split]
    number = int(step) if step.isascii() and step.isdigit() and len(step) <= 9 else None
    entry = next((e for e in entries if e.step == number), None)
    if not is_split(split) or entry is None:
        steps = ", ".join(str(e.step) for e in entries)
        raise StoreNotFoundError(
            f"No {split!r} step {step!r} for {store.project}/{store.name}: "
            + (f"its {split} steps are {steps}." if steps else f"it has no {split!r} steps.")
        )
    # A damaged file (a crash while it was written) shows what is readable, and says so.
    content = read_step_file(store, split, entry.step)
    return StepView(
        split,
        str(entry.step),
        build_groups(content.rows, state),
        metrics=entry.metrics,
        damage=content.note(),
    )


def log_again(split: str) -> str:
    """What to do about a logged step whose file is lost: log it again."""
    return f'log the step again with `await model.log(groups, split="{split}")`'


def read_step_file(store: ModelStore, split: str, step: int) -> TrajectoryFile:
    """The readable records of a logged step's file; a folder where the file belongs, or a file
    that cannot be read at all, is a `StoreFileDamagedError` (409) naming it and what to do."""
    path = store.trajectories_path(split, step)
    what = f"The {split} trajectories of step {step} ({path})"
    if path.is_dir():
        raise StoreFileDamagedError(
            f"{what} are a folder, not a file: move the folder away, then {log_again(split)}."
        )
    try:
        return read_trajectory_file(path)
    except OSError as error:
        raise StoreFileDamagedError(
            f"{what} cannot be read ({error.strerror or error}): make the file readable, or "
            f"{log_again(split)}."
        ) from error


def build_groups(rows: list[dict[str, Any]], state: ReviewState) -> list[GroupView]:
    """Rows -> groups (by their `group` index), each sorted by reward, decisions attached."""
    by_index: dict[int, GroupView] = {}
    for row in rows:
        index = row.get("group", 0)
        if not isinstance(index, int):  # not a row the trainer wrote: shown under group 0
            index = 0
        group = by_index.setdefault(index, GroupView(index, [], []))
        if "exception" in row:
            group.exceptions.append(str(row["exception"]))
        elif "id" in row:
            group.trajectories.append(TrajectoryView(row, index))
    for group in by_index.values():
        group.flag = state.group_flag(group.member_ids) if group.trajectories else None
        for trajectory in group.trajectories:
            trajectory.flag = state.trajectory_flag(trajectory.id)
            trajectory.override = state.override(trajectory.id)
            trajectory.group_flag = group.flag
        group.trajectories.sort(key=lambda t: t.reward, reverse=True)
    return [by_index[index] for index in sorted(by_index)]


def load_state(store: ModelStore) -> ReviewState:
    return review_state(read_decisions(store.dir))


def message_text(message: dict[str, Any]) -> str:
    """A message's text: string content, text parts, and its tool calls as `name(arguments)`."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        ]
        text = "\n".join(texts)
    else:
        text = "" if content is None else str(content)
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        text += f"\n{function.get('name', '')}({function.get('arguments', '')})"
    return text
