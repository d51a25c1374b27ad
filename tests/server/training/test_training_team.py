"""Rank 0's side of training on two processes of this machine (`TrainingTeam.launch`, gloo on
127.0.0.1): a rank lost after the update, in the adapters' checksum, fails the step by name and
leaves rank 0's adapter and optimizer as they were, so the step sent again applies once.

(A rank lost before the update, on other hosts and with the group formed again afterwards, is
tests/netns/test_trainer_across_hosts.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from art_backend._errors import TrainingRanksLostError
from art_backend.training._distributed import DataParallel, TrainingTeam, trainer_engine
from art_backend.training._grpo import loss_preset
from art_backend.training._trainer import LoraTrainer
from tests.server.training.test_distributed_training import LORA, SETTINGS, three_groups


def test_a_rank_lost_in_the_checksum_leaves_rank_0s_adapter_as_it_was(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # the team sets it; put back afterwards
    device = torch.device("cpu")
    engine = trainer_engine(str(tiny_model_dir), dtype="float32", device=device)
    team = TrainingTeam.launch(2, model=str(tiny_model_dir), dtype="float32", device=device)
    try:
        trainer = LoraTrainer(engine, "team", LORA, seed=7)
        step: Any = (LoraTrainer.grpo_step, three_groups(), loss_preset("grpo"), SETTINGS)
        team.run(trainer, *step, beta=0.0)  # a first step: the optimizer has moments
        params = [p.detach().clone() for p in trainer.params]
        moments = [trainer.optimizer.state[p]["exp_avg"].clone() for p in trainer.params]
        steps = trainer.optimizer_steps
        checksum = DataParallel.check_same_parameters

        def rank_1_dies_first(self: DataParallel, tensors: list[torch.Tensor]) -> None:
            team.processes[0].kill()
            team.processes[0].wait()
            checksum(self, tensors)

        monkeypatch.setattr(DataParallel, "check_same_parameters", rank_1_dies_first)
        with pytest.raises(TrainingRanksLostError, match="the adapters' checksum failed"):
            team.run(trainer, *step, beta=0.0)
        assert trainer.optimizer_steps == steps
        for before, after in zip(params, trainer.params, strict=True):
            assert torch.equal(before, after)
        for before, param in zip(moments, trainer.params, strict=True):
            assert torch.equal(before, trainer.optimizer.state[param]["exp_avg"])
        assert all(p.grad is None for p in trainer.params)
    finally:
        team.stop()
