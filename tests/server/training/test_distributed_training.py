"""Training on several processes: two ranks (gloo, 127.0.0.1) give one process's adapter.

The steps: GRPO over three groups of unequal trained-token counts (ranks get 2:1 groups), GRPO
over one group with a KL term (rank 1 gets no rows, and still joins the all-reduce), then SFT
(rows shared one by one). The negative control shards the rows before the trainer, so each rank
divides by its own denominator: the naive port the global denominator exists to prevent.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

import art_core as art
from art_backend.training._distributed import (
    DataParallel,
    join_group,
    shard_rows,
    trainer_engine,
)
from art_backend.training._grpo import loss_preset
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._rows import Rows, Sequence, pack_rows
from art_backend.training._trainer import LoraTrainer
from tests.support.servers import free_port

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
SETTINGS = OptimizerSettings(learning_rate=1e-2, micro_batch_tokens=64)
CLOSE = {"atol": 1e-5, "rtol": 1e-5}


def sequence(prompt: int, completion: int, *, group: int, row: int, advantage: float) -> Sequence:
    """`prompt` context tokens (the group's own) then `completion` sampled ones (the row's own)."""
    generator = torch.Generator().manual_seed(1000 * group + row)
    prompt_ids = torch.randint(3, 120, (prompt,), generator=torch.Generator().manual_seed(group))
    answer_ids = torch.randint(3, 120, (completion,), generator=generator)
    mask = torch.cat(
        [torch.zeros(prompt, dtype=torch.bool), torch.ones(completion, dtype=torch.bool)]
    )
    old = -torch.rand(prompt + completion, generator=generator) * 3
    return Sequence(
        input_ids=torch.cat([prompt_ids, answer_ids]),
        trained_mask=mask,
        old_logprobs=torch.where(mask, old, 0.0),
        advantage=advantage,
        trajectory_id=f"g{group}-r{row}",
        group_id=group,
        truncated=False,
    )


def rows_of(shapes: list[tuple[int, int, int]]) -> Rows:
    """(group, prompt length, completion length) per row; advantages alternate around zero."""
    sequences = [
        sequence(prompt, completion, group=group, row=row, advantage=(-1.0) ** row * (1 + row / 4))
        for row, (group, prompt, completion) in enumerate(shapes)
    ]
    rows, dropped = pack_rows(sequences, max_length=10_000, mask_truncated=False)
    assert not any(dropped.values())
    return rows


def three_groups() -> Rows:
    """Long answers (group 0), long prompts with short answers (group 1), a short pair (group
    2): by tokens the ranks take {0} and {1, 2}, whose trained tokens differ about 3:1."""
    return rows_of(
        [(0, 8, 24 + i) for i in range(4)]
        + [(1, 28, 4 + i % 2) for i in range(4)]
        + [(2, 6, 6), (2, 6, 7)]
    )


def one_group() -> Rows:
    return rows_of([(3, 10, 12 + i) for i in range(4)])


def run_steps(trainer: LoraTrainer, share: Any = None) -> list[dict[str, float]]:
    """The three steps; `share(rows, keep_groups)` hands the trainer pre-sharded rows (the
    negative control), None hands it the whole step."""
    share = share or (lambda rows, keep_groups=True: rows)
    grpo = loss_preset("grpo")
    return [
        trainer.grpo_step(share(three_groups()), grpo, SETTINGS, beta=0.0),
        trainer.grpo_step(share(one_group()), grpo, SETTINGS, beta=0.04),
        trainer.sft_step(share(three_groups(), keep_groups=False), SETTINGS),
    ]


class PerRankDenominator(DataParallel):
    """The naive port: the caller shards, so the trainer's denominator counts one rank's rows."""

    def shard(self, rows: Rows, *, keep_groups: bool = True) -> Rows:
        return rows


def rank_main(rank: int, world_size: int, port: int, model: str, out: str) -> None:
    """One rank of the two: the correct trainer and the per-rank-denominator one, same seed."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    device = torch.device("cpu")
    data_parallel = join_group(
        rank, world_size, f"tcp://127.0.0.1:{port}", device, timeout=timedelta(seconds=120)
    )
    engine = trainer_engine(model, dtype="float32", device=device)
    correct = LoraTrainer(engine, "correct", LORA, seed=7, data_parallel=data_parallel)
    naive_group = PerRankDenominator(rank, world_size)
    naive = LoraTrainer(engine, "naive", LORA, seed=7, data_parallel=naive_group)
    metrics = run_steps(correct)
    run_steps(
        naive,
        share=lambda rows, keep_groups=True: data_parallel.shard(rows, keep_groups=keep_groups),
    )
    result = {
        "correct": [p.detach().clone() for p in correct.params],
        "naive": [p.detach().clone() for p in naive.params],
        "metrics": metrics,
        "after_a_failure": step_after_rank_1_fails(correct, rank),
    }
    torch.save(result, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def step_after_rank_1_fails(trainer: LoraTrainer, rank: int) -> dict[str, Any]:
    """A step whose forward fails on rank 1 only: what each rank raised, whether the adapter
    stayed as it was, and whether the next step trains (the ranks still in step)."""

    def fail(*args: Any) -> Any:
        raise MemoryError("rank 1 ran out of memory")

    before = [p.detach().clone() for p in trainer.params]
    steps = trainer.optimizer_steps
    if rank == 1:
        trainer._logprobs = fail  # type: ignore[method-assign]
    try:
        trainer.grpo_step(three_groups(), loss_preset("grpo"), SETTINGS, beta=0.0)
        raised = ""
    except (RuntimeError, MemoryError) as error:
        raised = f"{type(error).__name__}: {error}"
    if rank == 1:
        del trainer._logprobs
    unchanged = trainer.optimizer_steps == steps and all(
        torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True)
    )
    trainer.grpo_step(three_groups(), loss_preset("grpo"), SETTINGS, beta=0.0)  # checksum inside
    return {"raised": raised, "unchanged": unchanged, "steps": trainer.optimizer_steps - steps}


@pytest.fixture(scope="module")
def one_and_two_processes(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The three steps on one process (here) and on two (spawned, gloo on 127.0.0.1)."""
    out = tmp_path_factory.mktemp("ranks")
    torch.multiprocessing.start_processes(
        rank_main,
        args=(2, free_port(), str(tiny_model_dir), str(out)),
        nprocs=2,
        start_method="spawn",
    )
    engine = trainer_engine(str(tiny_model_dir), dtype="float32", device=torch.device("cpu"))
    alone = LoraTrainer(engine, "alone", LORA, seed=7)
    initial = [p.detach().clone() for p in alone.params]
    metrics = run_steps(alone)
    ranks = [torch.load(out / f"rank{rank}.pt") for rank in range(2)]
    return {"initial": initial, "alone": alone.params, "metrics": metrics, "ranks": ranks}


def largest_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).detach().abs().max()) for x, y in zip(a, b, strict=True))


def test_two_processes_train_the_adapter_one_process_trains(one_and_two_processes: dict):
    result = one_and_two_processes
    two = result["ranks"][0]["correct"]
    moved = largest_difference(result["alone"], result["initial"])
    difference = largest_difference(result["alone"], two)
    print(f"\n1 vs 2 processes: max |delta| {difference:.3g} (largest update {moved:.3g})")
    assert moved > 1e-3  # the steps did train
    for alone, ranked in zip(result["alone"], two, strict=True):
        assert torch.allclose(alone, ranked, **CLOSE)
    # Both ranks hold the same adapter, bit for bit.
    for zero, one in zip(two, result["ranks"][1]["correct"], strict=True):
        assert torch.equal(zero, one)


def test_step_metrics_are_sums_over_the_ranks(one_and_two_processes: dict):
    alone, ranked = one_and_two_processes["metrics"], one_and_two_processes["ranks"][0]["metrics"]
    for step_alone, step_ranked in zip(alone, ranked, strict=True):
        assert step_ranked["trained_tokens"] == step_alone["trained_tokens"]
        for key in ("loss", "grad_norm", "entropy"):
            assert step_ranked[key] == pytest.approx(step_alone[key], rel=1e-4, abs=1e-6), key


def test_a_per_rank_denominator_is_caught(one_and_two_processes: dict):
    """The negative control: the same check fails when each rank divides by its own count."""
    result = one_and_two_processes
    naive = result["ranks"][0]["naive"]
    difference = largest_difference(result["alone"], naive)
    print(f"\nper-rank denominator: max |delta| {difference:.3g}")
    assert not all(
        torch.allclose(alone, ranked, **CLOSE)
        for alone, ranked in zip(result["alone"], naive, strict=True)
    )


def test_a_rank_that_fails_fails_the_step_on_every_rank(one_and_two_processes: dict):
    """Rank 1's forward raises: it still joins the all-reduce, every rank raises, nothing is
    trained, and the next step trains on both (their adapters' checksums agree)."""
    zero, one = (rank["after_a_failure"] for rank in one_and_two_processes["ranks"])
    assert zero["raised"].startswith("RuntimeError: 1 other training rank(s) failed")
    assert one["raised"] == "MemoryError: rank 1 ran out of memory"
    assert zero["unchanged"] and one["unchanged"]
    assert zero["steps"] == one["steps"] == 1


def test_groups_stay_whole_and_the_largest_go_first():
    rows = three_groups()
    shares = [shard_rows(rows, rank, 2) for rank in range(2)]
    assert [sorted(set(share.group_ids.tolist())) for share in shares] == [[0], [1, 2]]
    assert sorted(t for share in shares for t in share.trajectory_ids) == sorted(
        rows.trajectory_ids
    )
    # A rank may get nothing (one group, two ranks): an empty share, which trains nothing.
    assert shard_rows(one_group(), 1, 2).num_rows == 0
    # Without groups (SFT), rows are shared one by one.
    assert {shard_rows(rows, rank, 2, keep_groups=False).num_rows for rank in range(2)} == {5}


# ------------------------------------------------------------------- the server, two processes

QUESTIONS = ["What is 1 + 1?", "Name the capital of France, please.", "Hi"]


async def seeded_groups(model: art.TrainableModel) -> list[art.TrajectoryGroup]:
    """Three groups of four sampled answers, seeded (the same on any server of this base
    model), with rewards 0..3 so that every group trains. Not greedy: a group of identical rows
    whose advantages sum to zero has no gradient but rounding noise, which AdamW magnifies."""
    client = model.openai_client()
    groups = []
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        trajectories = []
        for reward in range(4):
            response = await client.chat.completions.create(
                model=model.get_inference_name(),
                messages=messages,  # type: ignore[arg-type]
                max_tokens=8 + 4 * len(groups),
                temperature=1.0,
                seed=100 * len(groups) + reward,
            )
            trajectories.append(
                art.Trajectory(
                    messages_and_choices=[*messages, response.choices[0]], reward=float(reward)
                )
            )
        groups.append(art.TrajectoryGroup(trajectories))
    return groups


async def one_step(backend: art.Backend, tiny_model_dir: Path) -> tuple[dict, list[Any]]:
    """Register a model, train one step on seeded groups; its adapter and the answers."""
    from safetensors.torch import load_file

    model = art.TrainableModel(name="dp", project="dp", base_model=str(tiny_model_dir))
    await model.register(backend)
    groups = await seeded_groups(model)
    result = await model.train(groups, learning_rate=1e-2)
    assert result.step == 1
    choices = [t.messages_and_choices[-1] for g in groups for t in g.trajectories]
    answers = [(c.token_ids, [round(x, 4) for x in c.sampled_logprobs]) for c in choices]
    return load_file(str(Path(result.checkpoint_path) / "adapter_model.safetensors")), answers


@pytest.mark.torch_engine
async def test_art_server_with_two_train_processes_trains_the_same_step(
    tiny_model_dir: Path, tmp_path: Path
):
    """`art-server --train-processes 2` (a second process it starts, gloo on 127.0.0.1) and
    `--train-processes 1`: the same seeded groups give the same step-1 adapter."""
    adapters, answers = [], []
    for processes in (1, 2):
        backend = art.LocalBackend(
            path=tmp_path / str(processes),
            dtype="float32",
            extra_args=["--train-processes", str(processes), "--threads", "1"],
        )
        try:
            adapter, answer = await one_step(backend, tiny_model_dir)
        finally:
            await backend.close()
        (manifest_file,) = (tmp_path / str(processes)).glob("**/manifest.json")
        manifest = json.loads(manifest_file.read_text())
        environment = manifest["environments"][manifest["current_environment"]]
        assert environment["train_processes"] == processes  # what `art replay` reads
        adapters.append(adapter)
        answers.append(answer)
    assert answers[0] == answers[1]  # the same groups went to both
    initial = adapters[0].keys()
    assert initial == adapters[1].keys()
    difference = max(float((adapters[0][k] - adapters[1][k]).abs().max()) for k in initial)
    print(f"\nart-server 1 vs 2 train processes: max |delta| {difference:.3g}")
    for key in initial:
        assert torch.allclose(adapters[0][key], adapters[1][key], **CLOSE), key
