"""Data-parallel training on several processes: one base model per rank, one adapter in sync.

Each rank holds the whole base model and its own copy of the trainable adapter. One step:

  rank 0 sends the step (its `Rows`) to every rank -> each rank divides by the step's GLOBAL
  loss denominator (computed on all rows, before sharding) -> trains its shard of the groups
  (`shard_rows`) -> one flat all_reduce(SUM) of the adapter gradients -> the same clip and
  AdamW on every rank -> a parameter checksum compared across ranks -> rank 0 saves the
  checkpoint and tells the engine(s).

Why the global denominator: the loss of a step is sum(token terms) / D over all rows. With D
per rank, the summed gradient weighs each rank's tokens by 1 / D_rank instead of 1 / D: the
measured update was off by 1.9x (docs/training.md, "Training on several processes"). With the
global D, each rank's gradient is its share of the one-process gradient and the SUM is that
gradient, whatever the shard sizes; a rank with no rows contributes zeros.

Why no `DistributedDataParallel`: the trainer's adapter lives inside the engine's
multi-adapter PEFT model (`set_adapter` moves `requires_grad` between adapters, and served
adapters share the modules), which DDP's reducer, registered at wrap time, does not follow. The
trainer already holds its adapter tensors (`LoraTrainer.params`) and runs its own micro-batch
loop, so one all-reduce in `LoraTrainer._optimizer_step` is all it needs. Every rank runs the
same three collectives per step (gradients, metric sums, checksum) whatever its share of rows,
so no rank waits for a collective another never starts.

Backends: gloo on CPU (tested here, on 127.0.0.1), NCCL on CUDA (the branch is written; it has
not run here). Ranks other than 0 are started by the server (`art-server --train-processes N`,
`TrainingTeam.launch`) or by torchrun, and run `serve_rank` until rank 0 stops them.
Commands travel with `broadcast_object_list` (pickle): the ranks trust each other and rank 0's
rendezvous port, as torchrun's ranks do; bind it to loopback or a private network only.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from art_backend._errors import InvalidRequestError
from art_backend.training._rows import Rows

if TYPE_CHECKING:
    from art_backend.training._trainer import LoraTrainer

logger = logging.getLogger("art_backend.training")

# A worker waits in a collective for rank 0's next command, which may be hours away (a server
# between steps): its timeout is long, and a worker whose parent is gone exits itself. Rank 0
# waits in a collective only for the other ranks' share of a step, or for them to join: torch's
# default timeout, so a rank that never comes fails the start or the step instead of hanging it.
IDLE_TIMEOUT = timedelta(days=365)
STEP_TIMEOUT = timedelta(minutes=30)


# ------------------------------------------------------------------------------------- sharding


def shard_rows(rows: Rows, rank: int, world_size: int, *, keep_groups: bool = True) -> Rows:
    """Rank `rank`'s share of `rows`: whole groups (their shared prompt packs together), the
    largest first onto the least-loaded rank (by tokens), original row order kept.

    `keep_groups=False` shares single rows (SFT rows carry no groups). Deterministic: every
    rank computes the same split from the same rows.
    """
    lengths = rows.lengths.tolist()
    units: dict[int, list[int]] = {}
    for index in range(rows.num_rows):
        key = int(rows.group_ids[index]) if keep_groups else index
        units.setdefault(key, []).append(index)
    members = list(units.values())
    load = [0] * world_size
    mine: list[int] = []
    for unit in sorted(members, key=lambda m: (-sum(lengths[i] for i in m), m[0])):
        target = min(range(world_size), key=lambda r: (load[r], r))
        load[target] += sum(lengths[i] for i in unit)
        if target == rank:
            mine += unit
    return rows.select(sorted(mine))


# ------------------------------------------------------------------------------ data parallel


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the training ranks; the collectives one step needs."""

    rank: int
    world_size: int
    group: Any = None  # a torch ProcessGroup; None: the default group

    def shard(self, rows: Rows, *, keep_groups: bool = True) -> Rows:
        """This rank's share of the step's rows (`shard_rows`)."""
        return shard_rows(rows, self.rank, self.world_size, keep_groups=keep_groups)

    def all_reduce_gradients(self, params: list[torch.Tensor]) -> None:
        """Sum every rank's adapter gradients, in one flat all-reduce; a missing grad is zeros."""
        grads = [
            p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
            for p in params
        ]
        flat = torch.cat(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for param in params:
            size = param.numel()
            param.grad = flat[offset : offset + size].view_as(param).clone()
            offset += size

    def sum_numbers(self, numbers: list[float], device: torch.device) -> list[float]:
        """The sum over ranks of each number (float64: token counts stay exact)."""
        tensor = torch.tensor(numbers, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor.tolist()

    def check_same_parameters(self, params: list[torch.Tensor]) -> None:
        """Raise unless every rank's adapter has the same checksum: every rank applied the same
        update to the same numbers, so the copies are equal bit for bit."""
        flat = torch.cat([p.detach().reshape(-1).double() for p in params])
        checksum = torch.stack([flat.sum(), (flat * flat).sum()])
        both = torch.cat([checksum, -checksum])  # max of x and of -x: the largest and smallest
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        if not torch.equal(both[:2], -both[2:]):
            raise RuntimeError(
                "The training ranks' adapters differ after this step (checksums "
                f"{both[:2].tolist()} vs {(-both[2:]).tolist()}): a rank missed an update. "
                "Restart the server; the last checkpoint is intact."
            )

    def broadcast_trainer_state(self, trainer: LoraTrainer) -> None:
        """Copy rank 0's adapter tensors, optimizer state and step count onto every rank."""
        with torch.no_grad():
            for param in trainer.params:
                dist.broadcast(param.data, src=0, group=self.group)
        payload: list[Any] = [None]
        if self.rank == 0:  # on the CPU: another rank must not unpickle onto rank 0's GPU
            payload = [(_to_cpu(trainer.optimizer.state_dict()), trainer.optimizer_steps)]
        dist.broadcast_object_list(payload, src=0, group=self.group)
        if self.rank != 0:
            state, steps = payload[0]
            trainer.optimizer.load_state_dict(state)
            trainer.optimizer_steps = steps
        self.check_same_parameters(trainer.params)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    return value


def join_group(
    rank: int,
    world_size: int,
    init_method: str,
    device: torch.device,
    *,
    timeout: timedelta = IDLE_TIMEOUT,
) -> DataParallel:
    """Join the ranks' default process group: NCCL when the model is on CUDA, else gloo."""
    if device.type == "cuda":  # NCCL: written, not run here (no GPU in this project's tests)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
    )
    return DataParallel(rank, world_size)


# ------------------------------------------------------------------- rank 0 and the other ranks


@dataclass(frozen=True)
class OpenAdapter:
    """Create trainer `adapter_name` with `lora`, then take rank 0's state of it."""

    adapter_name: str
    lora: dict[str, Any]


@dataclass(frozen=True)
class TrainerCall:
    """Run `step(trainer, *args, **kwargs)` (`LoraTrainer.grpo_step` or `sft_step`) on every
    rank; the step function travels by reference (its module and name), as pickle sends it."""

    adapter_name: str
    step: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Stop:
    """Leave the group and exit."""


def is_training_step(step: Callable[..., Any]) -> bool:
    """Whether `step` is one of the trainer's steps, the only calls the ranks run."""
    from art_backend.training._trainer import LoraTrainer

    return step in (LoraTrainer.grpo_step, LoraTrainer.sft_step)


@dataclass
class TrainingTeam:
    """Rank 0's side: runs each step on every rank (rank 0's own trainer among them)."""

    data_parallel: DataParallel
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _synced: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def launch(
        cls, processes: int, *, model: str, dtype: str, device: torch.device
    ) -> TrainingTeam:
        """Start ranks 1..processes-1 on this machine (each loads `model`), and join them."""
        port = _free_port()
        init_method = f"tcp://127.0.0.1:{port}"
        if device.type == "cpu":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # else gloo picks the host's address
        started = []
        for rank in range(1, processes):
            command = [
                sys.executable,
                "-m",
                "art_backend.training._distributed",
                f"--rank={rank}",
                f"--world-size={processes}",
                f"--init-method={init_method}",
                f"--model={model}",
                f"--dtype={dtype}",
                f"--device={_rank_device(device, rank)}",
                f"--parent-pid={os.getpid()}",
            ]
            started.append(subprocess.Popen(command, env=os.environ.copy()))
        logger.info("training on %d processes (%s)", processes, init_method)
        try:
            data_parallel = join_group(0, processes, init_method, device, timeout=STEP_TIMEOUT)
        except BaseException:
            for process in started:
                process.kill()
            raise
        return cls(data_parallel, started)

    @classmethod
    def join_torchrun(cls, device: torch.device) -> TrainingTeam:
        """Rank 0 of a torchrun launch (its ranks run `serve_torchrun_rank`)."""
        rank, world_size = torchrun_rank() or (0, 1)
        assert rank == 0
        return cls(join_group(0, world_size, "env://", device, timeout=STEP_TIMEOUT))

    def run(self, trainer: LoraTrainer, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`step(trainer, ...)` here and on every other rank, on the same arguments."""
        if not is_training_step(step):
            raise ValueError(f"{step!r} is not a training step (grpo_step, sft_step)")
        with self._lock:
            if trainer.adapter_name not in self._synced:
                # The first step of this adapter: the other ranks copy rank 0's (a fresh
                # init, or a checkpoint it loaded at registration).
                self._send(OpenAdapter(trainer.adapter_name, trainer.lora))
                trainer.data_parallel = self.data_parallel
                self.data_parallel.broadcast_trainer_state(trainer)
                self._synced.add(trainer.adapter_name)
            self._send(TrainerCall(trainer.adapter_name, step, args, kwargs))
            return step(trainer, *args, **kwargs)

    def stop(self) -> None:
        """Tell the other ranks to exit, wait for them, and leave the group."""
        with self._lock:
            if self.processes and all(p.poll() is None for p in self.processes):
                self._send(Stop())
            for process in self.processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
            if dist.is_initialized():
                dist.destroy_process_group()

    def _send(self, command: Any) -> None:
        dist.broadcast_object_list([command], src=0, group=self.data_parallel.group)


def start_team(
    processes: int, *, model: str, dtype: str, device: torch.device
) -> TrainingTeam | None:
    """The team of `art-server --train-processes N` (N - 1 processes started here), or of
    torchrun's ranks when torchrun started this server; None for one process."""
    launched = torchrun_rank()
    if launched is not None:
        if processes not in (1, launched[1]):
            raise InvalidRequestError(
                f"--train-processes {processes} under torchrun with {launched[1]} ranks: "
                "leave --train-processes out, torchrun already started the ranks."
            )
        return TrainingTeam.join_torchrun(device)
    if processes == 1:
        return None
    if device.type == "cuda" and processes > torch.cuda.device_count():
        raise InvalidRequestError(
            f"--train-processes {processes} needs a GPU per process on CUDA; this machine "
            f"has {torch.cuda.device_count()}. Use at most that many."
        )
    return TrainingTeam.launch(processes, model=model, dtype=dtype, device=device)


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) when torchrun started this process among several ranks, else None."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ["RANK"]), world_size) if world_size > 1 else None


def serve_torchrun_rank(model: str, *, dtype: str, device: str) -> None:
    """A rank other than 0 under torchrun: the server's arguments, no server (`serve_rank`)."""
    rank, world_size = torchrun_rank() or (0, 1)
    local = int(os.environ.get("LOCAL_RANK", rank))
    wants_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    torch_device = torch.device(f"cuda:{local}" if wants_cuda else "cpu")
    data_parallel = join_group(rank, world_size, "env://", torch_device)
    serve_rank(data_parallel, trainer_engine(model, dtype=dtype, device=torch_device))


def serve_rank(data_parallel: DataParallel, engine: Any) -> None:
    """The loop of a rank other than 0: run rank 0's commands until it says Stop."""
    from art_backend.training._trainer import LoraTrainer

    trainers: dict[str, LoraTrainer] = {}
    while True:
        received: list[Any] = [None]
        try:
            dist.broadcast_object_list(received, src=0, group=data_parallel.group)
        except RuntimeError:  # gloo's "Connection closed by peer": rank 0 exited (a signal)
            logger.info("rank %d: rank 0 has gone; exiting", data_parallel.rank)
            return
        command = received[0]
        if isinstance(command, Stop):
            break
        if isinstance(command, OpenAdapter):
            trainer = LoraTrainer(
                engine, command.adapter_name, command.lora, data_parallel=data_parallel
            )
            trainers[command.adapter_name] = trainer
            data_parallel.broadcast_trainer_state(trainer)
        elif isinstance(command, TrainerCall) and is_training_step(command.step):
            trainer = trainers[command.adapter_name]
            try:
                command.step(trainer, *command.args, **command.kwargs)
            except Exception:  # rank 0 reports the step's failure; this rank waits for the next
                logger.exception("rank %d: %s failed", data_parallel.rank, command.step.__name__)
        else:
            raise RuntimeError(f"rank {data_parallel.rank}: unknown command {command!r}")
    dist.destroy_process_group()


def _rank_device(device: torch.device, rank: int) -> str:
    """One GPU per rank on a CUDA machine (rank r on cuda:r); every rank on the CPU otherwise."""
    return f"cuda:{rank}" if device.type == "cuda" else "cpu"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """A rank whose server is gone (killed without stopping it) must not hold its memory."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """A rank other than 0, started by `TrainingTeam.launch`: load the model, serve commands."""
    parser = argparse.ArgumentParser(prog="art_backend.training._distributed")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--parent-pid", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"rank {args.rank}: %(message)s")
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)
    device = torch.device(args.device)
    data_parallel = join_group(args.rank, args.world_size, args.init_method, device)
    serve_rank(data_parallel, trainer_engine(args.model, dtype=args.dtype, device=device))


def trainer_engine(model: str, *, dtype: str, device: torch.device) -> Any:
    """The base model of a rank other than 0, in an engine that is never started: the trainer
    borrows its model as it borrows the server's."""
    from art_backend.engines._loading import load_model
    from art_backend.engines._torch_engine import TorchEngine

    loaded = load_model(model, dtype=dtype, device=device.type)  # cuda: the current device
    return TorchEngine(
        loaded.model,
        loaded.tokenizer,
        eos_token_ids=loaded.eos_token_ids,
        context_length=loaded.context_length,
    )


if __name__ == "__main__":
    # Run as the module itself, not as __main__: commands from rank 0 unpickle as
    # art_backend.training._distributed's classes, which `serve_rank` checks for.
    from art_backend.training._distributed import main as module_main

    module_main()
