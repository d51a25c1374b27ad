"""Training orchestration: registered models, one queue of steps, groups -> rows -> GRPO -> step N+1.

The flow of one `train` call, top to bottom in `_train`:
  recorded completions of each trajectory -> advantages per group (`_grpo`) -> token rows
  (`_rows`) -> one optimizer step (`_trainer`) -> checkpoint N+1 written atomically
  (`_checkpoints`) -> served as `<name>@<N+1>` -> history row and trajectories logged.
Anything not trained is counted in the step's metrics under `dropped/...` or `groups/...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import logging
import math
import shutil
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import BackendError, ConflictError, InvalidRequestError
from art_backend.serving._engine import Engine, TrainableEngine
from art_backend.serving._loading import unmatched_target_modules
from art_backend.serving._records import CompletionRecords
from art_backend.store._checkpoints import (
    STEP_TRAJECTORIES,
    ModelStore,
    fault_point,
    read_trajectories,
    write_trajectory_rows,
)
from art_backend.store._review_decisions import read_review_state, remove_all_pending
from art_backend.training._grpo import (
    LossConfig,
    advantages_from_rewards,
    loss_preset,
)
from art_backend.training._prepared_step import (
    PreparedStep,
    check_advantages,
    finite_metrics,
    mean_and_std,
    prepare_step,
    reward_metrics,
    why_nothing_trained,
)
from art_backend.training._rows import (
    Rows,
    pack_rows,
    sft_sequence,
)
from art_backend.training._schemas import (
    DeleteCheckpointsRequest,
    GroupPayload,
    LogRequest,
    RegisterRequest,
    SFTRequest,
    TrainRequest,
    TrainSettings,
    trajectory_rows,
)
from art_backend.training._trainer import (
    TRAINER_STATE,
    LoraTrainer,
    OptimizerSettings,
    TrainerStateError,
    read_trainer_state,
)

logger = logging.getLogger("art_backend.training")


class ModelNotRegisteredError(BackendError):
    """Training or logging for a model this backend has not registered (HTTP 404)."""

    status_code = 404
    error_type = "not_found_error"


@dataclass
class RegisteredModel:
    store: ModelStore
    trainer: LoraTrainer
    step: int
    base_model: str
    lora: dict[str, Any]
    served: list[int] = field(default_factory=list)  # steps loaded in the engine, oldest first
    # How many steps stay loaded: the newest and the ones rollouts may still be finishing on.
    served_steps: int = 2

    @property
    def name(self) -> str:
        return self.store.name

    def inference_name(self, step: int | None = None) -> str:
        return f"{self.store.name}@{self.step if step is None else step}"

    def info(self) -> dict[str, Any]:
        return {
            "project": self.store.project,
            "name": self.store.name,
            "base_model": self.base_model,
            "step": self.step,
            "inference_name": self.inference_name(),
            "checkpoints": self.store.checkpoint_steps(),
            "lora": self.lora,
        }


class TrainingService:
    """Registers models and runs their training steps one at a time, beside the engine."""

    def __init__(
        self,
        engine: Engine,
        records: CompletionRecords,
        *,
        art_path: Path,
        base_names: list[str],
        trainer_host: TrainableEngine | None = None,
    ) -> None:
        """`engine` serves; `trainer_host` holds the model the trainer updates. They are one
        object for the torch engine (colocated: the trainer borrows the served weights between
        decode steps) and two for an engine in another process (vLLM), which then loads each
        new step's adapter from its checkpoint folder."""
        if trainer_host is None:
            if not isinstance(engine, TrainableEngine):
                raise TypeError(f"{type(engine).__name__} cannot train: pass a trainer_host")
            trainer_host = engine
        self.engine = engine
        self.trainer_host = trainer_host
        self.records = records
        self.art_path = art_path
        self.base_names = base_names
        self.models: dict[tuple[str, str], RegisteredModel] = {}
        self._adapter_numbers = itertools.count()
        self._step_lock = asyncio.Lock()  # one training step at a time on this engine
        self._waiting = 0
        self.steps_total = 0
        # All model work of training runs on one thread: glibc gives each thread its own malloc
        # arena, and a step's ~1.5 GB of activations freed on six pool threads kept six arenas
        # at their peak (8.5 GB resident for SmolLM2-135M, measured).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-trainer")

    async def _in_trainer_thread(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, functools.partial(function, *args, **kwargs)
            )
        finally:
            release_free_memory()

    def _engine_paused(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """An engine sharing one GPU with the trainer (vLLM sleep mode) sleeps during a step."""
        paused = getattr(self.engine, "paused", None)
        return paused() if paused is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------------------ registration

    async def register(self, request: RegisterRequest) -> dict[str, Any]:
        """Create or resume a model: its latest complete checkpoint is loaded and served."""
        if request.base_model not in self.base_names:
            raise InvalidRequestError(
                f"This backend serves {self.base_names[0]!r}; the model asks for base model "
                f"{request.base_model!r}. Start a backend for that model or change base_model.",
                param="base_model",
            )
        _check_target_modules(self.trainer_host.adaptable_modules, request.lora.target_modules)
        _check_rank(getattr(self.engine, "max_lora_rank", None), request.lora.r)
        key = (request.project, request.name)
        async with self._step_lock:
            self._check_name_free(request)
            if key in self.models:
                model = self.models[key]
                if request.served_steps != model.served_steps:
                    await self._in_trainer_thread(
                        self._set_served_steps, model, request.served_steps
                    )
                return {**model.info(), "resumed": True, "repairs": []}
            return await self._in_trainer_thread(self._register_blocking, request)

    def _check_name_free(self, request: RegisterRequest) -> None:
        """Served names are `name` and `name@step` without the project (ART's names, which
        clients send as `model=`), so one server cannot serve one name for two projects."""
        for project, name in self.models:
            if name == request.name and project != request.project:
                raise ConflictError(
                    f"Model name {name!r} is already registered on this backend by project "
                    f"{project!r}; served names carry no project, so a second {name!r} would "
                    "answer for the first. Give this model another name, or start another "
                    "backend (its own --path and port) for this project."
                )

    def _set_served_steps(self, model: RegisteredModel, served_steps: int) -> None:
        model.served_steps = served_steps
        self._trim_served(model)

    def _register_blocking(self, request: RegisterRequest) -> dict[str, Any]:
        store = ModelStore(self.art_path, request.project, request.name)
        saved = store.read_model_config()
        if saved is not None and saved.get("base_model") not in self.base_names:
            raise InvalidRequestError(
                f"Model {request.project}/{request.name} under {self.art_path} was trained on "
                f"base model {saved.get('base_model')!r}; this backend serves "
                f"{self.base_names[0]!r}. Register it under another name, or start a backend "
                "for its base model.",
                param="base_model",
            )
        repairs = []
        if removed := store.remove_stale_temporaries():
            repairs.append(f"removed {removed} incomplete checkpoint folder(s) left by a crash")
        repairs += store.repair_history()
        repairs += store.repair_trajectories()
        if held := remove_all_pending(store.dir):
            repairs.append(f"forgot {held} step(s) held for review by a server that stopped")
        latest = store.latest_step()
        resumed = latest is not None
        # The fork's source is checked before anything is written for the new model.
        fork = self._fork_source(request) if latest is None and request.fork_from else None
        lora = request.lora.model_dump()
        if saved is not None and saved["lora"] != lora:
            logger.warning("%s: keeping the saved LoRA settings %s", request.name, saved["lora"])
            lora = saved["lora"]
        if saved is None:
            store.write_model_config({"base_model": request.base_model, "lora": lora})

        trainer = LoraTrainer(
            self.trainer_host, f"train_{next(self._adapter_numbers)}", lora, seed=request.seed
        )
        try:
            if fork is not None:
                latest = self._copy_fork(*fork, store)
            if latest is None:
                store.write_checkpoint(0, trainer.save, {"kind": "initial"})
                latest = 0
            trainer.load(store.checkpoint_dir(latest))
        except BaseException:
            trainer.close()  # its adapter must not stay in the engine's model
            raise
        model = RegisteredModel(
            store, trainer, latest, request.base_model, lora, served_steps=request.served_steps
        )
        # Steps the server already serves (found at startup) count toward the served window.
        model.served = sorted(
            step
            for step in store.checkpoint_steps()
            if model.inference_name(step) in self.engine.adapters and step != latest
        )
        self.models[(request.project, request.name)] = model
        self._serve_step(model, latest)
        for repair in repairs:
            logger.warning("%s: %s", request.name, repair)
        return {**model.info(), "resumed": resumed, "repairs": repairs}

    def _fork_source(self, request: RegisterRequest) -> tuple[ModelStore, int]:
        """The checkpoint `fork_from` names, checked: inside --path, same base model, plain files,
        a trainer state that loads without unpickling. Every refusal is a 400 on `fork_from`."""
        fork = request.fork_from
        assert fork is not None
        where = f"{fork.project}/{fork.name}"
        try:
            source = ModelStore(self.art_path, fork.project, fork.name)
            steps = source.checkpoint_steps()
            step = fork.step if fork.step is not None else (steps[-1] if steps else None)
            if step is None or step not in steps:
                raise InvalidRequestError(
                    f"Cannot fork from {where} step {fork.step}: "
                    f"available checkpoints {steps or 'none'}."
                )
            config = source.read_model_config() or {}
            if config.get("base_model", request.base_model) not in self.base_names:
                raise InvalidRequestError(
                    f"Cannot fork from {where}: it was trained on base model "
                    f"{config['base_model']!r}, and this backend serves {self.base_names[0]!r}."
                )
            source.checkpoint_files(step)  # refuses a checkpoint holding symbolic links
            state_path = source.checkpoint_dir(step) / TRAINER_STATE
            if state_path.is_file():
                read_trainer_state(state_path)
        except (InvalidRequestError, TrainerStateError) as error:
            message = (
                error.message
                if error.message.startswith("Cannot")
                else (f"Cannot fork from {where}: {error.message}")
            )
            raise InvalidRequestError(message, param="fork_from") from error
        return source, step

    def _copy_fork(self, source: ModelStore, step: int, store: ModelStore) -> int:
        def copy(tmp: Path) -> None:
            for relative in source.checkpoint_files(step):
                (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source.checkpoint_dir(step) / relative, tmp / relative)

        store.write_checkpoint(
            step, copy, {"kind": "fork", "source": f"{source.project}/{source.name}@{step}"}
        )
        return step

    def _serve_step(self, model: RegisteredModel, step: int) -> None:
        self.engine.load_adapter(model.inference_name(step), model.store.checkpoint_dir(step))
        model.served.append(step)
        self._trim_served(model)

    def _trim_served(self, model: RegisteredModel) -> None:
        while len(model.served) > model.served_steps:
            old = model.served.pop(0)
            if model.inference_name(old) in self.engine.adapters:
                self.engine.unload_adapter(model.inference_name(old))

    def get(self, project: str, name: str) -> RegisteredModel:
        model = self.models.get((project, name))
        if model is None:
            raise ModelNotRegisteredError(
                f"Model {project}/{name} is not registered on this backend: "
                "call `await model.register(backend)` first."
            )
        return model

    # ---------------------------------------------------------------------------------- training

    async def queued_steps(self, work: Any) -> AsyncIterator[dict[str, Any]]:
        """Run `work()` (a coroutine function) after the steps ahead of it; yield events meanwhile.

        The work runs as its own task: a client that disconnects does not cancel a step halfway.
        """
        ahead = self._waiting + (1 if self._step_lock.locked() else 0)
        if ahead:
            yield {"type": "queued", "ahead": ahead}
        progress: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def run() -> dict[str, Any]:
            self._waiting += 1
            try:
                await self._step_lock.acquire()
            finally:
                self._waiting -= 1
            try:
                return await work(progress)
            finally:
                self._step_lock.release()

        task = asyncio.create_task(run())
        while not task.done():
            getter = asyncio.create_task(progress.get())
            done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield getter.result()
            else:
                getter.cancel()
        while not progress.empty():
            yield progress.get_nowait()
        error = task.exception()
        if error is not None:
            status = error.status_code if isinstance(error, BackendError) else 500
            message = error.message if isinstance(error, BackendError) else repr(error)
            yield {"type": "error", "status": status, "message": message}
        else:
            yield {"type": "result", **task.result()}

    def validate_train(self, project: str, name: str, request: TrainRequest) -> RegisteredModel:
        """Checks that need no model work: a bad request fails before it is queued."""
        model = self.get(project, name)
        loss_config = loss_config_for(request.config)  # raises on an inconsistent preset override
        if not request.groups:
            raise InvalidRequestError("No trajectory groups to train on.", param="groups")
        rewards = [t.reward for group in request.groups for t in group.trajectories]
        group_ids = [index for index, g in enumerate(request.groups) for _ in g.trajectories]
        advantages, _ = advantages_from_rewards(
            torch.tensor(rewards, dtype=torch.float64),
            torch.tensor(group_ids, dtype=torch.long),
            scale_rewards=loss_config.scale_rewards,
        )
        check_advantages(advantages, loss_config.scale_rewards)
        return model

    async def train(
        self, model: RegisteredModel, request: TrainRequest, progress: asyncio.Queue
    ) -> dict[str, Any]:
        """One GRPO step; returns {"step", "metrics", "warnings", "advantages"}.

        recorded turns, reviewers' decisions applied (`prepare_step`) -> one advantage per
        trajectory from its group (`PreparedStep.set_advantages`) -> token rows (`_pack`) ->
        one optimizer step (`_optimizer_step`) -> checkpoint N+1 (`_commit_step`).
        """
        started = time.perf_counter()
        loss_config = loss_config_for(request.config)
        # Reviewers' flags and reward overrides in force now (read after any review hold).
        step = prepare_step(
            request, read_review_state(model.store.dir), self.records, model_name=model.name
        )
        step.set_advantages(loss_config.scale_rewards, loss_config.advantage_balance)
        if request.config.truncated_importance_sampling and not loss_config.precalculate_logprobs:
            step.warnings.append(
                "truncated_importance_sampling was not applied: it weighs the trainer's logprobs "
                "against the sampler's, so it needs precalculate_logprobs=True (ART skips it "
                "likewise)."
            )
        rows = self._pack(step, request.config)
        await progress.put({"type": "progress", "stage": "rows", "rows": rows.num_rows})
        if rows.num_rows == 0:
            reason = why_nothing_trained(step.metrics)
            step.warnings.append(
                f"Nothing trained this step: {reason}. The step stays {model.step}."
            )
            step.metrics.update(trained=0.0, step_seconds=time.perf_counter() - started)
            model.store.append_history(
                {
                    "type": "train_skipped",
                    "step": model.step,
                    "metrics": step.metrics,
                    "reason": reason,
                }
            )
            return step.answer(model.step)
        settings = OptimizerSettings.from_config(request.config)
        # ART's num_trajectories_learning_rate_multiplier_power: lr x (trained trajectories)^p.
        power = request.config.num_trajectories_learning_rate_multiplier_power
        if power:
            settings = dataclasses.replace(
                settings, learning_rate=settings.learning_rate * sum(step.trainable) ** power
            )
        step.metrics.update(
            await self._optimizer_step(
                model, rows, loss_config, settings, step, beta=request.config.beta
            )
        )
        step.metrics.update(
            trained=1.0,
            learning_rate=settings.learning_rate,
            step_seconds=time.perf_counter() - started,
        )
        await self._commit_step(
            model,
            "train",
            step.metrics,
            trajectories=trajectory_rows(request.groups, step.annotations),
            # The loss as it ran (preset and overrides): which objective made this step.
            details={"loss": dataclasses.asdict(loss_config)},
        )
        return step.answer(model.step, str(model.store.checkpoint_dir(model.step)))

    def _pack(self, step: PreparedStep, config: TrainSettings) -> Rows:
        """The trainable trajectories as padded token rows; what does not fit is counted."""
        max_length = config.max_length or self.engine.context_length
        rows, drops = pack_rows(
            step.sequences(), max_length=max_length, mask_truncated=config.mask_truncated
        )
        for reason, count in drops.items():
            step.metrics[f"dropped/{reason}"] = step.metrics.get(f"dropped/{reason}", 0.0) + count
        step.metrics["rows"] = float(rows.num_rows)
        return rows

    async def _optimizer_step(
        self,
        model: RegisteredModel,
        rows: Rows,
        loss_config: LossConfig,
        settings: OptimizerSettings,
        step: PreparedStep,
        *,
        beta: float,
    ) -> dict[str, float]:
        """The GRPO loss over the rows and one optimizer step, on the trainer's thread."""
        try:
            async with self._engine_paused():
                return await self._in_trainer_thread(
                    model.trainer.grpo_step, rows, loss_config, settings, beta=beta
                )
        except FloatingPointError as error:  # the trainer skipped the step: nothing changed
            largest = max((abs(a) for a in step.advantages), default=0.0)
            raise InvalidRequestError(
                f"This step's gradient is not finite ({error}); nothing was trained. The "
                f"largest advantage is {largest:g}: rescale the rewards, or use "
                'scale_rewards "group" (the default) or "batch".',
                param="groups",
            ) from error

    async def _commit_step(
        self,
        model: RegisteredModel,
        kind: str,
        metrics: dict[str, float],
        trajectories: list[dict[str, Any]] | None = None,
        details: dict[str, Any] | None = None,
    ):
        """Checkpoint N+1 atomically, serve it, log its trajectories, then record it in history
        (its row: type, step, metrics, and `details`).

        The trajectories it trained on ride in the checkpoint too: a crash before the history
        row is written is repaired from the checkpoint, trajectories included (`repair_history`).
        """
        new_step = model.step + 1

        def write_files(folder: Path) -> None:
            model.trainer.save(folder)
            if trajectories is not None:
                write_trajectory_rows(folder / STEP_TRAJECTORIES, trajectories)

        await self._in_trainer_thread(
            model.store.write_checkpoint,
            new_step,
            write_files,
            {"kind": kind, "metrics": metrics, "written_at": time.time()},
        )
        model.step = new_step
        # Optimizer state (2x the adapter) is needed only to resume, the trajectories copy only
        # to repair the newest step: both stay in the newest checkpoint alone.
        for extra in (TRAINER_STATE, STEP_TRAJECTORIES):
            await self._in_trainer_thread(model.store.prune_file, extra, keep_step=new_step)
        await self._in_trainer_thread(self._serve_step, model, new_step)
        fault_point("before_trajectories")
        if trajectories is not None:  # the rollouts of step N trained into N+1
            await self._in_trainer_thread(
                model.store.write_trajectories, "train", new_step - 1, trajectories
            )
        fault_point("before_history")
        model.store.append_history(
            {"type": kind, "step": new_step, "metrics": metrics, **(details or {})}
        )
        self.steps_total += 1

    # ---------------------------------------------------------------------------------------- SFT

    async def train_sft(
        self, model: RegisteredModel, request: SFTRequest, progress: asyncio.Queue
    ) -> dict[str, Any]:
        """Supervised steps on assistant turns (a warm start); one checkpoint at the end.

        One optimizer step per batch of `batch_size` trajectories (in the order sent, epochs
        after one another), each at its rate of the `learning_rate` schedule.
        """
        started = time.perf_counter()
        config = request.config
        tokenizer = self.engine.tokenizer
        sequences = []
        for index, example in enumerate(request.trajectories):
            try:
                sequences.append(
                    sft_sequence(
                        tokenizer,
                        example.messages,
                        example.tools,
                        assistant_turns=config.assistant_turns,
                    )
                )
            except ValueError as error:
                raise InvalidRequestError(
                    f"trajectories[{index}]: {error}", param=f"trajectories[{index}]"
                ) from error
        if not sequences:
            raise InvalidRequestError("Nothing to train: no trajectories.", param="trajectories")
        max_length = config.max_length or self.engine.context_length
        batch_size = config.resolved_batch_size()
        batches = [
            sequences[start : start + batch_size]
            for _ in range(config.epochs)
            for start in range(0, len(sequences), batch_size)
        ]
        try:
            rates = config.batch_learning_rates(len(batches))
        except ValueError as error:
            raise InvalidRequestError(str(error), param="config.learning_rate") from error
        losses: list[float] = []
        trained_tokens = 0
        dropped = 0
        for number, (batch, rate) in enumerate(zip(batches, rates, strict=True)):
            rows, drops = pack_rows(batch, max_length=max_length, mask_truncated=False)
            dropped += drops["over_length"]
            if rows.num_rows:
                settings = OptimizerSettings(
                    learning_rate=rate,
                    max_grad_norm=config.max_grad_norm,
                    weight_decay=config.weight_decay,
                    micro_batch_tokens=config.micro_batch_tokens,
                    gradient_checkpointing=config.gradient_checkpointing,
                )
                async with self._engine_paused():
                    step = await self._in_trainer_thread(model.trainer.sft_step, rows, settings)
                losses.append(step["loss"])
                trained_tokens += int(step["trained_tokens"])
            await progress.put({"type": "progress", "done": number + 1, "total": len(batches)})
        metrics = {
            "loss": losses[-1] if losses else 0.0,
            "loss_first": losses[0] if losses else 0.0,
            "optimizer_steps": float(len(losses)),
            "examples": float(len(sequences)),
            "trained_tokens": float(trained_tokens),
            "batch_size": float(batch_size),
            "dropped/over_length": float(dropped),
            # The last batch's rate: where a schedule ended (the peak is the user's own number).
            "learning_rate": rates[-1] if rates else 0.0,
            "step_seconds": time.perf_counter() - started,
        }
        if not losses:
            raise InvalidRequestError(
                f"Nothing to train: all {len(sequences)} examples are longer than {max_length} tokens."
            )
        await self._commit_step(model, "sft", metrics)
        return {"step": model.step, "metrics": metrics, "warnings": []}

    # ------------------------------------------------------------------------------ logs & admin

    async def log(self, model: RegisteredModel, request: LogRequest) -> dict[str, Any]:
        """Record groups and/or metrics at a step: one "log" history row + trajectories file.

        The rule that keeps a trained step from counting twice: a step is its one "train" row,
        written by the train call (its trajectories in train/<step - 1>). A log never writes a
        "train" row. A train-split log at a step with a train row (ART's
        `model.log(groups, metrics=result.metrics, step=result.step, split="train")`) keeps
        out of its row the metrics that row already holds with the same value, and writes no
        trajectory whose id the train split already holds at that step or the one before; the
        answer counts them in `already_recorded`.
        """
        step = model.step if request.step is None else request.step
        if step > model.step:
            raise InvalidRequestError(
                f"step {step} is ahead of the model's step {model.step}: log at a step it has "
                "reached (result.step of a train call, or None for the current one).",
                param="step",
            )
        if not request.groups and not request.metrics:
            raise InvalidRequestError(
                "Nothing to log: pass trajectory groups, metrics= or both.", param="groups"
            )
        metrics = _group_metrics(request.groups) if request.groups else {}
        metrics.update(request.metrics)  # the caller's own, as ART merges them
        metrics = finite_metrics(metrics)
        if not request.groups and not metrics["dropped/non_finite_metrics"]:
            del metrics["dropped/non_finite_metrics"]  # a metrics-only log holds just those
        rows = trajectory_rows(request.groups)
        repeated_metrics: list[str] = []
        known_ids: set[str] = set()
        if request.split == "train":
            trained = [
                row
                for row in model.store.read_history()
                if row.get("type") == "train" and row.get("step") == step
            ]
            for row in trained:
                for key, value in row.get("metrics", {}).items():
                    if metrics.get(key) == value:
                        repeated_metrics.append(key)
                        del metrics[key]
            known_ids = await self._in_trainer_thread(_logged_ids, model.store, "train", step)
        written = [row for row in rows if row.get("id") is None or row["id"] not in known_ids]
        record: dict[str, Any] = {
            "type": "log", "split": request.split, "step": step, "metrics": metrics,
        }  # fmt: skip
        if repeated_metrics or len(written) < len(rows):
            record["already_recorded"] = {
                "metrics": sorted(repeated_metrics),
                "trajectories": len(rows) - len(written),
            }
        model.store.append_history(record)
        if written:
            await self._in_trainer_thread(
                model.store.write_trajectories, request.split, step, written
            )
        return {k: v for k, v in record.items() if k != "type"}

    async def delete_checkpoints(
        self, model: RegisteredModel, request: DeleteCheckpointsRequest
    ) -> dict[str, Any]:
        """Delete all checkpoints but the latest and the best by a logged metric, or exactly
        `request.steps` (a retention strategy's choice)."""
        if request.steps is not None:
            return await self._delete_steps(model, sorted(set(request.steps)))
        split, _, metric = request.best_checkpoint_metric.rpartition("/")
        split = split or "val"
        scores = {
            row["step"]: row["metrics"][metric]
            for row in model.store.read_history()
            if row.get("type") == "log" and row.get("split") == split and metric in row["metrics"]
        }
        steps = model.store.checkpoint_steps()
        scored = [step for step in steps if step in scores]
        best = (
            (max if request.maximize else min)(scored, key=lambda s: scores[s]) if scored else None
        )
        keep = {model.step, *([best] if best is not None else [])}
        async with self._step_lock:
            deleted = await self._delete_unlocked(model, [s for s in steps if s not in keep])
        return {"kept": sorted(keep), "deleted": deleted, "best_step": best}

    async def _delete_steps(self, model: RegisteredModel, steps: list[int]) -> dict[str, Any]:
        async with self._step_lock:  # model.step cannot move while the choice is checked
            if model.step in steps:
                raise InvalidRequestError(
                    f"Step {model.step} is {model.name}'s latest step, which it serves and trains "
                    "from; it is never deleted. Leave it out of steps.",
                    param="steps",
                )
            present = set(model.store.checkpoint_steps())
            if missing := [step for step in steps if step not in present]:
                raise InvalidRequestError(
                    f"{model.name} has no checkpoint for step(s) {missing}; its checkpoints are "
                    f"{sorted(present)}.",
                    param="steps",
                )
            deleted = await self._delete_unlocked(model, steps)
        kept = sorted(present - set(deleted))
        return {"kept": kept, "deleted": deleted, "best_step": None}

    async def _delete_unlocked(self, model: RegisteredModel, steps: list[int]) -> list[int]:
        """Unload (if served) and delete each step; the caller holds the step lock."""
        for step in steps:
            served_name = model.inference_name(step)
            if served_name in self.engine.adapters:
                await self._in_trainer_thread(self.engine.unload_adapter, served_name)
            if step in model.served:
                model.served.remove(step)
            await self._in_trainer_thread(model.store.delete_checkpoint, step)
        return steps


def _group_metrics(groups: list[GroupPayload]) -> dict[str, float]:
    """A log's summary of its groups: reward mean/std, each trajectory metric's mean, counts."""
    rewards = [t.reward for g in groups for t in g.trajectories]
    metrics = reward_metrics(rewards)
    per_metric: dict[str, list[float]] = {}
    non_finite = 0  # a trajectory's inf or NaN metric: left out of its mean, counted
    for group in groups:
        for trajectory in group.trajectories:
            for key, value in trajectory.metrics.items():
                if math.isfinite(value):
                    per_metric.setdefault(key, []).append(value)
                else:
                    non_finite += 1
    metrics.update({key: mean_and_std(values)[0] for key, values in per_metric.items()})
    metrics["exceptions"] = float(sum(len(g.exceptions) for g in groups))
    metrics["trajectories"] = float(len(rewards))
    for group in groups:
        for key, value in group.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + value
    metrics["dropped/non_finite_metrics"] = float(non_finite)
    return metrics


def _logged_ids(store: ModelStore, split: str, step: int) -> set[str]:
    """Trajectory ids the split's files of `step` and `step - 1` already hold."""
    ids: set[str] = set()
    for at in (step - 1, step):
        path = store.trajectories_path(split, at) if at >= 0 else None
        if path is not None and path.is_file():
            ids.update(str(row["id"]) for row in read_trajectories(path) if "id" in row)
    return ids


def release_free_memory() -> None:
    """Hand memory freed by a step back to the OS (glibc keeps it otherwise); no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def loss_config_for(config: TrainSettings) -> LossConfig:
    """The preset `config.loss` names, with the config's fields over it (None keeps the preset's)."""
    overrides: dict[str, Any] = {
        "advantage_balance": config.advantage_balance,
        "kl_penalty_coef": config.kl_penalty_coef,
        "kl_penalty_source": config.kl_penalty_source,
        "ratio_max": config.max_negative_advantage_importance_sampling_weight,
        "mask_ratio": config.mask_prob_ratio,
        "kimi_k2_tau": config.kimi_k2_tau,
        "precalculate_logprobs": config.precalculate_logprobs,
        "truncated_is_max": config.truncated_importance_sampling,
    }
    if config.importance_sampling_level is not None:
        overrides["ratio_level"] = config.importance_sampling_level
    if config.scale_rewards is not None:
        overrides["scale_rewards"] = config.scale_rewards
    if config.epsilon is not None:
        overrides["eps_low"] = config.epsilon
    if config.epsilon_high is not None:
        overrides["eps_high"] = config.epsilon_high
    elif config.epsilon is not None and config.loss != "grpo":
        overrides["eps_high"] = config.epsilon
    if config.max_completion_length is not None:
        overrides["max_completion_length"] = config.max_completion_length
    try:
        return loss_preset(config.loss, **overrides)
    except ValueError as error:
        raise InvalidRequestError(str(error), param="config") from error


def _check_target_modules(module_names: list[str], targets: list[str]) -> None:
    """400 before anything is saved when lora.target_modules names no module of the model."""
    if unmatched := unmatched_target_modules(module_names, targets):
        known = sorted({name.rsplit(".", 1)[-1] for name in module_names})
        raise InvalidRequestError(
            f"lora.target_modules names {unmatched}, which match no module of the base model; "
            f"its adaptable modules are {', '.join(known)}.",
            param="lora.target_modules",
        )


def _check_rank(max_rank: int | None, rank: int) -> None:
    """400 at registration when the serving engine cannot hold an adapter of this rank."""
    if max_rank is not None and rank > max_rank:
        raise InvalidRequestError(
            f"lora.r is {rank}, above the vLLM engine's --max-lora-rank {max_rank}: register "
            f"with lora.r <= {max_rank}, or restart art-server with --max-lora-rank {rank}.",
            param="lora.r",
        )
