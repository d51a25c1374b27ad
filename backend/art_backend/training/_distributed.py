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

Backends: gloo on CPU (tested here, on 127.0.0.1 and across network-namespace hosts), NCCL
on CUDA (the branch is written; it has not run here). Ranks other than 0 are started by the
server (`art-server --train-processes N`, `TrainingTeam.launch`), by torchrun, or by hand on
other machines (`art-server` with torchrun's variables, `_rendezvous`), and run `_other_ranks`
until rank 0 stops them. Commands travel with `broadcast_object_list` (pickle): the ranks trust
each other and rank 0's rendezvous port, as torchrun's ranks do; bind it to loopback or a
private network only.

A lost rank (a cut link, a dead host): a step's collective fails after the rendezvous's
`collective_timeout` with `TrainingRanksLostError`, on every rank, and nothing is trained; the
ranks leave the group, and rank 0 forms it again, with the adapters copied from rank 0, when
the step is sent again (`_rendezvous`, "Meeting again").
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from art_backend._errors import InvalidRequestError, TrainingRanksLostError
from art_backend.training._rendezvous import (
    REFORM_PATIENCE,
    Rendezvous,
    form_group,
    open_generation,
)
from art_backend.training._rows import Rows

if TYPE_CHECKING:
    from art_backend.training._trainer import LoraTrainer

logger = logging.getLogger("art_backend.training")

# A worker waits for rank 0's next command, which may be hours away (a server between steps):
# its timeout is long, and a worker whose parent is gone exits itself. Rank 0 waits for the
# others to join: torch's default timeout, as ranks on other machines may start late. Inside a
# step, every rank waits at most the rendezvous's collective_timeout (`_rendezvous`).
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
        with collective("the gradients' all-reduce"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for param in params:
            size = param.numel()
            param.grad = flat[offset : offset + size].view_as(param).clone()
            offset += size

    def sum_numbers(self, numbers: list[float], device: torch.device) -> list[float]:
        """The sum over ranks of each number (float64: token counts stay exact)."""
        tensor = torch.tensor(numbers, dtype=torch.float64, device=device)
        with collective("the step sums' all-reduce"):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor.tolist()

    def check_same_parameters(self, params: list[torch.Tensor]) -> None:
        """Raise unless every rank's adapter has the same checksum: every rank applied the same
        update to the same numbers, so the copies are equal bit for bit."""
        flat = torch.cat([p.detach().reshape(-1).double() for p in params])
        checksum = torch.stack([flat.sum(), (flat * flat).sum()])
        both = torch.cat([checksum, -checksum])  # max of x and of -x: the largest and smallest
        with collective("the adapters' checksum"):
            dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        if not torch.equal(both[:2], -both[2:]):
            raise RuntimeError(
                "The training ranks' adapters differ after this step (checksums "
                f"{both[:2].tolist()} vs {(-both[2:]).tolist()}): a rank missed an update. "
                "Restart the server; the last checkpoint is intact."
            )

    def broadcast_trainer_state(self, trainer: LoraTrainer) -> None:
        """Copy rank 0's adapter tensors, optimizer state and step count onto every rank."""
        with torch.no_grad(), collective("the adapter's broadcast"):
            for param in trainer.params:
                dist.broadcast(param.data, src=0, group=self.group)
        payload: list[Any] = [None]
        if self.rank == 0:  # on the CPU: another rank must not unpickle onto rank 0's GPU
            payload = [(_to_cpu(trainer.optimizer.state_dict()), trainer.optimizer_steps)]
        with collective("the optimizer state's broadcast"):
            dist.broadcast_object_list(payload, src=0, group=self.group)
        if self.rank != 0:
            state, steps = payload[0]
            trainer.optimizer.load_state_dict(state)
            trainer.optimizer_steps = steps
        self.check_same_parameters(trainer.params)


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """Raise a collective's failure (gloo's timeout, a connection closed by the peer) as
    `TrainingRanksLostError`, which names it."""
    try:
        yield
    except RuntimeError as error:  # torch's DistBackendError, gloo's errors: RuntimeErrors
        raise TrainingRanksLostError(
            f"A training rank is out of reach: {what} failed ({str(error).strip()[:300]}). "
            "Nothing was trained; send the step again once the ranks' hosts reach each other "
            "(the group is formed again then)."
        ) from error


def _to_cpu(value: Any) -> Any:
    return _tensors_mapped(value, lambda tensor: tensor.detach().cpu())


def _cloned(value: Any) -> Any:
    return _tensors_mapped(value, lambda tensor: tensor.detach().clone())


def _tensors_mapped(value: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` (a state dict: dicts and lists of tensors and numbers), each tensor changed."""
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, dict):
        return {key: _tensors_mapped(item, change) for key, item in value.items()}
    if isinstance(value, list):
        return [_tensors_mapped(item, change) for item in value]
    return value


def join_group(
    rank: int,
    world_size: int,
    init_method: str,
    device: torch.device,
    *,
    timeout: timedelta = IDLE_TIMEOUT,
) -> DataParallel:
    """Join the ranks' default process group at `init_method` (one group, never formed
    again): NCCL when the model is on CUDA, else gloo."""
    dist.init_process_group(
        _backend(device), init_method=init_method, rank=rank, world_size=world_size, timeout=timeout
    )
    return DataParallel(rank, world_size)


def join_generation(
    rendezvous: Rendezvous, store: Any, generation: int, device: torch.device, timeout: timedelta
) -> DataParallel:
    """Join generation `generation` of the ranks' group (`_rendezvous`); a step's collectives
    run in a group of their own, which waits the rendezvous's collective_timeout."""
    step_group = form_group(rendezvous, store, generation, _backend(device), timeout)
    return DataParallel(rendezvous.rank, rendezvous.world_size, step_group)


def _backend(device: torch.device) -> str:
    if device.type == "cuda":  # NCCL: written, not run here (no GPU in this project's tests)
        torch.cuda.set_device(device)
        return "nccl"
    return "gloo"


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
    """Rank 0's side: runs each step on every rank (rank 0's own trainer among them), and forms
    the group again after a step lost a rank."""

    data_parallel: DataParallel
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    rendezvous: Rendezvous | None = None
    store: Any = None  # the ranks' TCPStore (None: a group joined by `join_group`)
    generation: int = 1
    lost: bool = False  # a step lost a rank: the group is formed again before the next one
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _synced: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def launch(
        cls, processes: int, *, model: str, dtype: str, device: torch.device
    ) -> TrainingTeam:
        """Start ranks 1..processes-1 on this machine (each loads `model`), and join them."""
        rendezvous = Rendezvous.local(processes)
        started = []
        for rank in range(1, processes):
            command = [
                sys.executable,
                "-m",
                "art_backend.training._other_ranks",
                f"--master={rendezvous.master_addr}:{rendezvous.master_port}",
                f"--rank={rank}",
                f"--world-size={processes}",
                f"--model={model}",
                f"--dtype={dtype}",
                f"--device={_rank_device(device, rank)}",
                f"--parent-pid={os.getpid()}",
            ]
            started.append(subprocess.Popen(command, env=os.environ.copy()))
        try:
            return cls.join(rendezvous, device, started)
        except BaseException:
            for process in started:
                process.kill()
            raise

    @classmethod
    def join(
        cls,
        rendezvous: Rendezvous,
        device: torch.device,
        processes: list[subprocess.Popen[bytes]] | None = None,
    ) -> TrainingTeam:
        """Rank 0: open the ranks' store and wait for the others to join the group."""
        assert rendezvous.rank == 0
        store = rendezvous.connect_store(STEP_TIMEOUT)
        generation = open_generation(store)
        logger.info(
            "training on %d processes (rank 0 at %s:%d)",
            rendezvous.world_size, rendezvous.master_addr, rendezvous.master_port,
        )  # fmt: skip
        data_parallel = join_generation(rendezvous, store, generation, device, STEP_TIMEOUT)
        return cls(data_parallel, processes or [], rendezvous, store, generation, device=device)

    @classmethod
    def join_torchrun(cls, device: torch.device) -> TrainingTeam:
        """Rank 0 of ranks started by torchrun, or by hand with its variables on each host."""
        return cls.join(Rendezvous.from_environment(), device)

    def run(self, trainer: LoraTrainer, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`step(trainer, ...)` here and on every other rank, on the same arguments; a rank out
        of reach fails it with `TrainingRanksLostError`, and the next call forms the group again."""
        if not is_training_step(step):
            raise ValueError(f"{step!r} is not a training step (grpo_step, sft_step)")
        with self._lock:
            if self.lost:
                self._form_again()
            before = None
            try:
                if trainer.adapter_name not in self._synced:
                    # The first step of this adapter (or of this group): the other ranks copy
                    # rank 0's (a fresh init, a checkpoint it loaded, the last step's state).
                    self._send(OpenAdapter(trainer.adapter_name, trainer.lora))
                    trainer.data_parallel = self.data_parallel
                    self.data_parallel.broadcast_trainer_state(trainer)
                    self._synced.add(trainer.adapter_name)
                before = TrainerSnapshot.of(trainer)
                self._send(TrainerCall(trainer.adapter_name, step, args, kwargs))
                return step(trainer, *args, **kwargs)
            except TrainingRanksLostError:
                trainer.optimizer.zero_grad(set_to_none=True)  # this step's half-summed grads
                if before is not None and trainer.optimizer_steps != before.optimizer_steps:
                    before.restore(trainer)  # lost in the checksum, after the update
                self._leave()
                raise

    def stop(self) -> None:
        """Tell the other ranks to exit, wait for them, and leave the group."""
        with self._lock:
            if not self.lost and all(p.poll() is None for p in self.processes):
                with contextlib.suppress(TrainingRanksLostError):
                    self._send(Stop())
            for process in self.processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
            if dist.is_initialized():
                dist.destroy_process_group()

    def _send(self, command: Any) -> None:
        with collective(f"sending {type(command).__name__} to the other ranks"):
            dist.broadcast_object_list([command], src=0)

    def _leave(self) -> None:
        """Leave the broken group; every adapter is copied to the others again when it re-forms."""
        self.lost = True
        self._synced.clear()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _form_again(self) -> None:
        """A new generation of the group; the others must rejoin within a few collective
        timeouts (they notice the loss within one), else the step fails again."""
        if self.rendezvous is None:
            raise TrainingRanksLostError("This team's group cannot be formed again; restart it.")
        self.generation = open_generation(self.store)
        wait = self.rendezvous.collective_timeout * REFORM_PATIENCE
        try:
            self.data_parallel = join_generation(
                self.rendezvous, self.store, self.generation, self.device, wait
            )
        except RuntimeError as error:
            if dist.is_initialized():
                dist.destroy_process_group()
            raise TrainingRanksLostError(
                f"The other training ranks did not rejoin within {wait.total_seconds():.0f} s "
                f"({str(error).strip()[:200]}); nothing was trained. Send the step again once "
                "their hosts reach this one."
            ) from error
        self.lost = False
        logger.info("the training group formed again (generation %d)", self.generation)


@dataclass(frozen=True)
class TrainerSnapshot:
    """Rank 0's adapter and optimizer state before a step: the group can be lost after the
    update (in the checksum), and a step that raised must leave the adapter as it was, or the
    step sent again would apply twice. A copy of the adapter's size, three times over."""

    params: list[torch.Tensor]
    optimizer_state: dict[str, Any]
    optimizer_steps: int

    @classmethod
    def of(cls, trainer: LoraTrainer) -> TrainerSnapshot:
        """A copy of `trainer`'s adapter tensors, optimizer state and step count."""
        return cls(
            [param.detach().clone() for param in trainer.params],
            _cloned(trainer.optimizer.state_dict()),
            trainer.optimizer_steps,
        )

    def restore(self, trainer: LoraTrainer) -> None:
        """Put `trainer` back as it was when the snapshot was taken."""
        with torch.no_grad():
            for param, saved in zip(trainer.params, self.params, strict=True):
                param.copy_(saved)
        trainer.optimizer.load_state_dict(self.optimizer_state)
        trainer.optimizer_steps = self.optimizer_steps


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
    """(rank, world size) when torchrun (or its variables, set by hand) made this process one
    of several ranks, else None."""
    if int(os.environ.get("WORLD_SIZE", "1") or "1") <= 1:
        return None
    rendezvous = Rendezvous.from_environment()
    return rendezvous.rank, rendezvous.world_size


def _rank_device(device: torch.device, rank: int) -> str:
    """One GPU per rank on a CUDA machine (rank r on cuda:r); every rank on the CPU otherwise."""
    return f"cuda:{rank}" if device.type == "cuda" else "cpu"


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
