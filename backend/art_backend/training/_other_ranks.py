"""The ranks other than 0: each loads the base model, joins the group, and runs what rank 0
sends (`_distributed`'s commands) until it says Stop; after a lost group it rejoins the next
generation (`_rendezvous`, "Meeting again").

Started by `art-server --train-processes N` (`python -m art_backend.training._other_ranks`,
`TrainingTeam.launch`), or as `art-server` under torchrun or with its variables on another
machine (`serve_torchrun_rank`).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from art_backend._errors import TrainingRanksLostError
from art_backend.training._distributed import (
    IDLE_TIMEOUT,
    STEP_TIMEOUT,
    DataParallel,
    OpenAdapter,
    Stop,
    TrainerCall,
    is_training_step,
    join_generation,
    trainer_engine,
)
from art_backend.training._rendezvous import (
    REFORM_PATIENCE,
    Rendezvous,
    next_generation,
)

logger = logging.getLogger("art_backend.training")


def serve_torchrun_rank(model: str, *, dtype: str, device: str) -> None:
    """A rank other than 0 under torchrun: the server's arguments, no server (`serve_rank`)."""
    rendezvous = Rendezvous.from_environment()
    local = int(os.environ.get("LOCAL_RANK", rendezvous.rank))
    wants_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    torch_device = torch.device(f"cuda:{local}" if wants_cuda else "cpu")
    serve_rank(rendezvous, torch_device, trainer_engine(model, dtype=dtype, device=torch_device))


def serve_rank(rendezvous: Rendezvous, device: torch.device, engine: Any) -> None:
    """A rank other than 0, its model loaded (`engine`): join the group, run rank 0's commands
    until it says Stop; after a lost group, rejoin its next generation.

    The model loads before the rank joins: rank 0 waits for ranks to join (STEP_TIMEOUT), but
    within a step only collective_timeout, too short for loading a large model. For the first
    meeting rank 0's store may take STEP_TIMEOUT to answer (it may still be loading); after
    that, between commands (`RankZeroWatch`) and while waiting to meet again, the rank exits
    with `EXIT_RANK_ZERO_LOST` once rank 0's store has not answered for `rank_zero_patience`."""

    trainers: dict[str, Any] = {}
    generation = 0
    while True:
        patience = (
            STEP_TIMEOUT.total_seconds() if not generation else rank_zero_patience(rendezvous)
        )
        try:
            store, generation = next_generation(rendezvous, generation, patience)
            data_parallel = join_generation(rendezvous, store, generation, device, IDLE_TIMEOUT)
        except (TimeoutError, RuntimeError) as error:
            logger.error(
                "rank %d: no group to join (%s): rank 0 or its host is lost. Exiting; start "
                "this rank again once rank 0 is back.",
                rendezvous.rank,
                error,
            )
            raise SystemExit(EXIT_RANK_ZERO_LOST) from None
        watch = RankZeroWatch(rendezvous)
        try:
            done = serve_commands(data_parallel, engine, trainers, watch)
        finally:
            watch.stop()
        if done:
            break
        for trainer in trainers.values():  # a lost step's grads; rank 0 resends the adapters
            trainer.optimizer.zero_grad(set_to_none=True)
        dist.destroy_process_group()
        logger.info("rank %d: the group was lost; rejoining", rendezvous.rank)
    dist.destroy_process_group()


# The exit code of a rank that gave rank 0 up (EX_TEMPFAIL: start it again once rank 0 is back).
EXIT_RANK_ZERO_LOST = 75


def rank_zero_patience(rendezvous: Rendezvous) -> float:
    """Seconds a rank waits for rank 0's store to answer once it has met it: REFORM_PATIENCE
    collective timeouts (15 minutes by default)."""
    return REFORM_PATIENCE * rendezvous.collective_timeout.total_seconds()


class RankZeroWatch:
    """While this rank waits for rank 0's next command (gloo waits IDLE_TIMEOUT, a year: a
    host cut off or killed sends no "connection closed"), rank 0's store must answer. Once it
    has not for `rank_zero_patience`, the rank says so and exits (`EXIT_RANK_ZERO_LOST`): start
    it again once rank 0's host is back, as after a crash. (A blocked gloo call cannot be
    interrupted from another thread: exiting the process is the one way out.)"""

    def __init__(self, rendezvous: Rendezvous) -> None:
        self.rendezvous = rendezvous
        self.patience = rank_zero_patience(rendezvous)
        self.waiting = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rank-0-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        interval = min(max(self.patience / 10, 0.5), 30.0)
        answered = time.monotonic()
        while not self._stopped.wait(interval):
            try:
                # A connection to the store's port, closed at once (the store ignores it): a
                # store operation on a cut link did not return for minutes (measured).
                address = (self.rendezvous.master_addr, self.rendezvous.master_port)
                socket.create_connection(address, timeout=interval).close()
                answered = time.monotonic()
                continue
            except OSError as error:
                silent = time.monotonic() - answered
                if not self.waiting.is_set() or silent < self.patience:
                    continue
                logger.error(
                    "rank %d: rank 0's store at %s:%d has not answered for %.0f s while this "
                    "rank waited for its next command (%s): rank 0 or its host is lost. "
                    "Exiting; start this rank again once rank 0 is back.",
                    self.rendezvous.rank,
                    self.rendezvous.master_addr,
                    self.rendezvous.master_port,
                    silent,
                    error,
                )
                logging.shutdown()
                os._exit(EXIT_RANK_ZERO_LOST)


def serve_commands(
    data_parallel: DataParallel,
    engine: Any,
    trainers: dict[str, Any],
    watch: RankZeroWatch | None = None,
) -> bool:
    """Run rank 0's commands in this group: True at Stop, False when the group is lost."""
    from art_backend.training._trainer import LoraTrainer

    while True:
        received: list[Any] = [None]
        if watch is not None:
            watch.waiting.set()
        try:
            dist.broadcast_object_list(received, src=0)
        except RuntimeError:  # gloo's "Connection closed by peer": rank 0 left or exited
            return False
        finally:
            if watch is not None:
                watch.waiting.clear()
        command = received[0]
        if isinstance(command, Stop):
            return True
        if isinstance(command, OpenAdapter):
            trainer = trainers.get(command.adapter_name)
            if trainer is None:
                trainer = LoraTrainer(engine, command.adapter_name, command.lora)
                trainers[command.adapter_name] = trainer
            trainer.data_parallel = data_parallel
            try:
                data_parallel.broadcast_trainer_state(trainer)
            except TrainingRanksLostError:
                return False
        elif isinstance(command, TrainerCall) and is_training_step(command.step):
            try:
                command.step(trainers[command.adapter_name], *command.args, **command.kwargs)
            except TrainingRanksLostError:
                return False
            except Exception:  # rank 0 reports the step's failure; this rank waits for the next
                logger.exception("rank %d: %s failed", data_parallel.rank, command.step.__name__)
        else:
            raise RuntimeError(f"rank {data_parallel.rank}: unknown command {command!r}")


def _exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """A rank whose server is gone (killed without stopping it) must not hold its memory."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """A rank other than 0, started by `TrainingTeam.launch`: load the model, serve commands."""
    parser = argparse.ArgumentParser(prog="art_backend.training._other_ranks")
    parser.add_argument("--master", required=True, metavar="HOST:PORT")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--parent-pid", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"rank {args.rank}: %(message)s")
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)
    host, port = args.master.rsplit(":", 1)
    rendezvous = Rendezvous(host, int(port), args.rank, args.world_size)
    device = torch.device(args.device)
    serve_rank(rendezvous, device, trainer_engine(args.model, dtype=args.dtype, device=device))


if __name__ == "__main__":
    main()
