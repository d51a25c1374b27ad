"""Rank 0 of a training team on two namespace hosts: run as
`python -m tests.netns._trainer_driver JSON` on host a with torchrun's variables set (rank 1 is
`art-server` on host b with the same variables), it prints one JSON line, its answer.

It trains the team's adapter and, in the same process, the same adapter alone (one process,
the same seed and rows). Then a step with a pause before its gradient all-reduce: it writes
`in-step` into the marks folder and waits for `cut` (the test pulls host b's cable), the step
fails; it writes `failed` and waits for `up` (the cable is back), and sends the step again.
Then it idles (`idle`) until `released`, while the test cuts its own host off.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import TrainingRanksLostError
from art_backend.training._distributed import DataParallel, start_team, trainer_engine
from art_backend.training._grpo import loss_preset
from art_backend.training._trainer import LoraTrainer
from tests.server.training.test_distributed_training import LORA, SETTINGS, three_groups


def wait_for(mark: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not mark.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mark.name} never came")
        time.sleep(0.05)


@contextlib.contextmanager
def paused_before_the_all_reduce(marks: Path) -> Iterator[None]:
    """Rank 0 has computed its share, rank 1 has the step: the moment to pull the cable."""
    original = DataParallel.all_reduce_gradients

    def paused(self: DataParallel, params: list[torch.Tensor]) -> None:
        (marks / "in-step").touch()
        wait_for(marks / "cut")
        original(self, params)

    DataParallel.all_reduce_gradients = paused  # type: ignore[method-assign]
    try:
        yield
    finally:
        DataParallel.all_reduce_gradients = original  # type: ignore[method-assign]


def largest_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).detach().abs().max()) for x, y in zip(a, b, strict=True))


def main(spec: dict[str, Any]) -> dict[str, Any]:
    marks = Path(spec["marks"])
    torch.set_num_threads(1)
    device = torch.device("cpu")
    engine = trainer_engine(spec["model"], dtype="float32", device=device)
    team = start_team(1, model=spec["model"], dtype="float32", device=device)
    assert team is not None
    shared = LoraTrainer(engine, "team", LORA, seed=7)
    alone = LoraTrainer(engine, "alone", LORA, seed=7)
    initial = [p.detach().clone() for p in alone.params]
    grpo = loss_preset("grpo")
    team.run(shared, LoraTrainer.grpo_step, three_groups(), grpo, SETTINGS, beta=0.0)
    alone.grpo_step(three_groups(), grpo, SETTINGS, beta=0.0)
    answer: dict[str, Any] = {
        "moved": largest_difference(alone.params, initial),
        "first_step_difference": largest_difference(alone.params, shared.params),
    }
    before = [p.detach().clone() for p in shared.params]
    with paused_before_the_all_reduce(marks):
        try:
            team.run(shared, LoraTrainer.grpo_step, three_groups(), grpo, SETTINGS, beta=0.0)
            answer["error"] = None
        except TrainingRanksLostError as error:
            answer["error"] = type(error).__name__
            answer["message"] = error.message
    answer["unchanged"] = largest_difference(before, shared.params) == 0.0
    (marks / "failed").touch()
    wait_for(marks / "up")
    team.run(shared, LoraTrainer.grpo_step, three_groups(), grpo, SETTINGS, beta=0.0)
    alone.grpo_step(three_groups(), grpo, SETTINGS, beta=0.0)
    answer["rerun_difference"] = largest_difference(alone.params, shared.params)
    answer["generation"] = team.generation
    print(json.dumps(answer), flush=True)
    # Idle between steps, rank 1 waiting for the next command: the test cuts this host off.
    (marks / "idle").touch()
    wait_for(marks / "released", timeout=300)
    return answer  # no Stop: rank 1 is gone by now


if __name__ == "__main__":
    try:
        result = main(json.loads(sys.argv[1]))
    except BaseException as error:  # noqa: BLE001 - the test reads the traceback
        result = {"crashed": type(error).__name__, "traceback": traceback.format_exc()}
    print(json.dumps(result), flush=True)
