"""ART main's `art.training.sequencing`: a run's commands, admitted one place at a time.

A training run is a sequence: forward-backwards add gradients, an optimizer step applies them
and makes the next learner version. `RunCommandLedger` gives each command its place
(`sequence_id` 0, 1, 2, ...) and its `OperationRef` (the version it starts from, and for a step
or a load the version it produces). A command sent again with the same `request_id` and the
same body (a retry after a lost answer) is admitted once: the repeat gets the first one's
reference (`"replayed"`). Out of place, another run's, or a request id reused with another
body: `TrainingCommandError` saying which, and nothing is admitted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from art_core.errors import TrainingCommandError
from art_core.training.contracts import TRANSITIONS, OperationKind, OperationRef, RunCommand
from art_core.trajectories import TrajectoryGroup

__all__ = ["CommandAdmission", "RunCommandLedger"]


@dataclass(frozen=True)
class CommandAdmission:
    """A command's admission: `"admitted"` (new) or `"replayed"` (a repeat of an admitted
    one, answered by the same operation), and the operation's reference."""

    status: Literal["admitted", "replayed"]
    ref: OperationRef


def _plain(value: Any) -> Any:
    """A value pydantic cannot write as JSON by itself: a group is its trajectories."""
    if isinstance(value, TrajectoryGroup):
        return [trajectory.model_dump(mode="json") for trajectory in value.trajectories]
    return repr(value)


def command_digest(command: RunCommand) -> str:
    """The body's fingerprint (its JSON without the request id): a repeat must match it."""
    body = command.model_dump_json(exclude={"request_id"}, fallback=_plain)
    return hashlib.sha256(body.encode()).hexdigest()


class RunCommandLedger:
    """The commands of one run, in order. `learner_version` is the version after every admitted
    command (the projected version: admitted steps count before they finish)."""

    def __init__(self, run_id: str, *, learner_version: int = 0) -> None:
        self.run_id = run_id
        self.learner_version = learner_version
        self.next_sequence_id = 0
        self._seen: dict[str, tuple[str, OperationRef]] = {}

    def admit(self, command: RunCommand, kind: OperationKind) -> CommandAdmission:
        """Admit `command` as an operation of `kind`, or say why not (`TrainingCommandError`)."""
        if command.run_id != self.run_id:
            raise TrainingCommandError(
                f"command {command.request_id!r} is for run {command.run_id!r}; this client "
                f"trains {self.run_id!r}"
            )
        digest = command_digest(command)
        seen = self._seen.get(command.request_id)
        if seen is not None:
            if seen[0] != digest or seen[1].kind != kind:
                raise TrainingCommandError(
                    f"request_id {command.request_id!r} was used for another command; a retry "
                    "repeats the same body, a new command takes a new request_id"
                )
            return CommandAdmission("replayed", seen[1])
        if command.sequence_id != self.next_sequence_id:
            raise TrainingCommandError(
                f"command {command.request_id!r} has sequence_id {command.sequence_id}; this "
                f"run's next is {self.next_sequence_id} (commands are admitted in order, "
                "without gaps)"
            )
        transition = kind in TRANSITIONS
        ref = OperationRef(
            run_id=self.run_id,
            operation_id=f"op-{command.sequence_id:06d}-{digest[:12]}",
            sequence_id=command.sequence_id,
            learner_parent_version=self.learner_version,
            reserved_output_learner_version=self.learner_version + 1 if transition else None,
            kind=kind,
        )
        self._seen[command.request_id] = (digest, ref)
        self.next_sequence_id += 1
        if transition:
            self.learner_version += 1
        return CommandAdmission("admitted", ref)
