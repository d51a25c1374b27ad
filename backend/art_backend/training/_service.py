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
import functools
import itertools
import logging
import math
import shutil
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import BackendError, InvalidRequestError
from art_backend.serving._engine import TrainableEngine
from art_backend.serving._loading import unmatched_target_modules
from art_backend.serving._records import CompletionRecords
from art_backend.store._checkpoints import (
    STEP_TRAJECTORIES,
    ModelStore,
    fault_point,
    write_trajectory_rows,
)
from art_backend.store._review_decisions import ReviewState, read_review_state, remove_all_pending
from art_backend.training._grpo import (
    LossConfig,
    ScaleRewards,
    advantages_from_rewards,
    loss_preset,
)
from art_backend.training._rows import (
    Rows,
    Sequence,
    TrajectoryTurns,
    build_sequences,
    pack_rows,
    sft_sequence,
    turns_from_record,
)
from art_backend.training._schemas import (
    DeleteCheckpointsRequest,
    GroupPayload,
    LogRequest,
    RegisterRequest,
    SFTRequest,
    TrainRequest,
    TrainSettings,
    TrajectoryPayload,
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

SERVED_STEPS_PER_MODEL = 2  # the newest step and the one before it (rollouts still finishing)
# Counted in every train step: what reviewers' decisions (review page) left out or changed.
REVIEW_METRICS = ("review/flagged_trajectories", "review/flagged_groups", "review/reward_overrides")


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


@dataclass
class RecordedTrajectory:
    """One trajectory that may train: its recorded turns, in call order, and its reward."""

    trajectory_id: str
    group_id: int
    reward: float
    turns: list[Any]


@dataclass
class PreparedStep:
    """A train request read against the records, before any model work.

    `advantages` and `trainable` (one each per trajectory) exist after `set_advantages`.
    """

    trajectories: list[RecordedTrajectory]
    metrics: dict[str, float]
    warnings: list[str]
    annotations: dict[tuple[int, str], dict[str, Any]]  # (group index, trajectory id) -> notes
    advantages: list[float] = field(default_factory=list)
    trainable: list[bool] = field(default_factory=list)

    def set_advantages(self, scale_rewards: ScaleRewards) -> None:
        """One advantage per trajectory from its group (GRPO); a group whose rewards are all
        equal teaches nothing and is counted in `groups/zero_variance`."""
        rewards = torch.tensor([t.reward for t in self.trajectories], dtype=torch.float64)
        group_ids = torch.tensor([t.group_id for t in self.trajectories], dtype=torch.long)
        advantages, trainable = (
            advantages_from_rewards(rewards, group_ids, scale_rewards=scale_rewards)
            if self.trajectories
            else (rewards, rewards.bool())
        )
        _check_advantages(advantages, scale_rewards)  # reviewers' overrides too
        self.advantages = advantages.tolist()
        self.trainable = trainable.tolist()
        for trajectory, advantage in zip(self.trajectories, self.advantages, strict=True):
            note = self.annotations.setdefault((trajectory.group_id, trajectory.trajectory_id), {})
            note["advantage"] = advantage
        trainable_groups = {
            t.group_id for t, ok in zip(self.trajectories, self.trainable, strict=True) if ok
        }
        groups = {t.group_id for t in self.trajectories}
        self.metrics["groups/zero_variance"] = float(len(groups - trainable_groups))
        self.metrics["groups/trainable"] = float(len(trainable_groups))

    def sequences(self) -> list[Sequence]:
        """The token sequences of the trainable trajectories, each with its advantage."""
        sequences: list[Sequence] = []
        for trajectory, advantage, ok in zip(
            self.trajectories, self.advantages, self.trainable, strict=True
        ):
            if ok:
                sequences += build_sequences(
                    TrajectoryTurns(
                        trajectory.trajectory_id, trajectory.group_id, advantage, trajectory.turns
                    )
                )
        return sequences

    def answer(self, step: int) -> dict[str, Any]:
        """The route's answer; each trajectory's advantage goes back (its Langfuse export)."""
        return {
            "step": step,
            "metrics": self.metrics,
            "warnings": self.warnings,
            "advantages": {
                t.trajectory_id: float(a)
                for t, a in zip(self.trajectories, self.advantages, strict=True)
            },
        }


class TrainingService:
    """Registers models and runs their training steps one at a time, beside the engine."""

    def __init__(
        self,
        engine: TrainableEngine,
        records: CompletionRecords,
        *,
        art_path: Path,
        base_names: list[str],
    ) -> None:
        self.engine = engine
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

    # ------------------------------------------------------------------------------ registration

    async def register(self, request: RegisterRequest) -> dict[str, Any]:
        """Create or resume a model: its latest complete checkpoint is loaded and served."""
        if request.base_model not in self.base_names:
            raise InvalidRequestError(
                f"This backend serves {self.base_names[0]!r}; the model asks for base model "
                f"{request.base_model!r}. Start a backend for that model or change base_model.",
                param="base_model",
            )
        _check_target_modules(self.engine.adaptable_modules, request.lora.target_modules)
        key = (request.project, request.name)
        async with self._step_lock:
            if key in self.models:
                return {**self.models[key].info(), "resumed": True, "repairs": []}
            return await self._in_trainer_thread(self._register_blocking, request)

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
            self.engine, f"train_{next(self._adapter_numbers)}", lora, seed=request.seed
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
        model = RegisteredModel(store, trainer, latest, request.base_model, lora)
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
        while len(model.served) > SERVED_STEPS_PER_MODEL:
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
        loss_config = _loss_config(request.config)  # raises on an inconsistent preset override
        if not request.groups:
            raise InvalidRequestError("No trajectory groups to train on.", param="groups")
        rewards = [t.reward for group in request.groups for t in group.trajectories]
        group_ids = [index for index, g in enumerate(request.groups) for _ in g.trajectories]
        advantages, _ = advantages_from_rewards(
            torch.tensor(rewards, dtype=torch.float64),
            torch.tensor(group_ids, dtype=torch.long),
            scale_rewards=loss_config.scale_rewards,
        )
        _check_advantages(advantages, loss_config.scale_rewards)
        return model

    async def train(
        self, model: RegisteredModel, request: TrainRequest, progress: asyncio.Queue
    ) -> dict[str, Any]:
        """One GRPO step; returns {"step", "metrics", "warnings", "advantages"}.

        recorded turns, reviewers' decisions applied (`_prepare`) -> one advantage per
        trajectory from its group (`PreparedStep.set_advantages`) -> token rows (`_pack`) ->
        one optimizer step (`_optimizer_step`) -> checkpoint N+1 (`_commit_step`).
        """
        started = time.perf_counter()
        loss_config = _loss_config(request.config)
        # Reviewers' flags and reward overrides in force now (read after any review hold).
        step = self._prepare(request, read_review_state(model.store.dir))
        step.set_advantages(loss_config.scale_rewards)
        rows = self._pack(step, request.config)
        await progress.put({"type": "progress", "stage": "rows", "rows": rows.num_rows})
        if rows.num_rows == 0:
            reason = _why_nothing_trained(step.metrics)
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
        step.metrics.update(await self._optimizer_step(model, rows, loss_config, request, step))
        step.metrics.update(
            trained=1.0,
            learning_rate=request.config.learning_rate,
            step_seconds=time.perf_counter() - started,
        )
        await self._commit_step(
            model,
            "train",
            step.metrics,
            trajectories=trajectory_rows(request.groups, step.annotations),
        )
        return step.answer(model.step)

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
        request: TrainRequest,
        step: PreparedStep,
    ) -> dict[str, float]:
        """The GRPO loss over the rows and one optimizer step, on the trainer's thread."""
        settings = OptimizerSettings.from_config(request.config)
        try:
            return await self._in_trainer_thread(
                model.trainer.grpo_step, rows, loss_config, settings, beta=request.config.beta
            )
        except FloatingPointError as error:  # the trainer skipped the step: nothing changed
            largest = max((abs(a) for a in step.advantages), default=0.0)
            raise InvalidRequestError(
                f"This step's gradient is not finite ({error}); nothing was trained. The "
                f"largest advantage is {largest:g}: rescale the rewards, or use "
                'scale_rewards "group" (the default) or "batch".',
                param="groups",
            ) from error

    def _prepare(self, request: TrainRequest, review: ReviewState) -> PreparedStep:
        """Recorded turns of every trajectory in groups that can train; the rest counted.

        Reviewers' decisions apply first: a flagged group or trajectory is left out, an
        overridden reward replaces the submitted one (each counted under `review/...` and noted
        in the annotations, keyed by (group index, trajectory id)).
        """
        counts: Counter[str] = Counter()
        warnings: list[str] = []
        rewards: list[float] = []
        kept: list[RecordedTrajectory] = []
        annotations: dict[tuple[int, str], dict[str, Any]] = {}
        for group_id, group in enumerate(request.groups):
            counts["groups/submitted"] += 1
            counts["exceptions"] += len(group.exceptions)
            for name, value in group.metrics.items():
                if math.isfinite(value):
                    counts[name] += value  # type: ignore[assignment]
            for trajectory in group.trajectories:
                # A rollout's own count of what it could not keep (e.g. unused n > 1 choices).
                for name, value in trajectory.metrics.items():
                    if name.startswith("dropped/") and math.isfinite(value):
                        counts[name] += value  # type: ignore[assignment]
            members, applied = _apply_review(group, review)
            for trajectory_id, note in applied.items():
                annotations[(group_id, trajectory_id)] = note
            if members is None:
                counts["review/flagged_groups"] += 1
                continue
            for note in applied.values():
                counts[f"review/{note['review']['applied']}"] += 1
            rewards += [reward for _, reward in members]
            if len(members) < 2:
                counts["groups/too_small"] += 1
                continue
            for trajectory, reward in members:
                counts["trajectories"] += 1
                counts["context_assistant_messages"] += trajectory.context_assistant_messages
                turns = []
                for history in trajectory.histories:
                    for ref in history.turns:
                        record = self.records.get(ref.completion_id)
                        choices = turns_from_record(record) if record else []
                        if ref.choice_index >= len(choices):
                            counts["dropped/unknown_completion"] += 1
                            continue
                        turns.append(choices[ref.choice_index])
                if not turns:
                    counts["dropped/no_trainable_turns"] += 1
                kept.append(RecordedTrajectory(trajectory.id, group_id, reward, turns))
        if counts["dropped/unknown_completion"]:
            warnings.append(
                f"{counts['dropped/unknown_completion']} turn(s) reference completions this "
                "backend has no record of (served elsewhere, or evicted after an hour): not trained."
            )
        metrics = {name: float(value) for name, value in counts.items()}
        for name in (
            "dropped/unknown_completion",
            "dropped/no_trainable_turns",
            "groups/too_small",
            *REVIEW_METRICS,
        ):
            metrics.setdefault(name, 0.0)
        metrics.update(_reward_metrics(rewards))
        for name, value in request.client_metrics.items():
            if math.isfinite(value):
                metrics[name] = metrics.get(name, 0.0) + value
        # Sums of huge group metrics overflow to inf: those are dropped and counted.
        return PreparedStep(kept, _finite_metrics(metrics), warnings, annotations)

    async def _commit_step(
        self,
        model: RegisteredModel,
        kind: str,
        metrics: dict[str, float],
        trajectories: list[dict[str, Any]] | None = None,
    ):
        """Checkpoint N+1 atomically, serve it, log its trajectories, then record it in history.

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
        model.store.append_history({"type": kind, "step": new_step, "metrics": metrics})
        self.steps_total += 1

    # ---------------------------------------------------------------------------------------- SFT

    async def train_sft(
        self, model: RegisteredModel, request: SFTRequest, progress: asyncio.Queue
    ) -> dict[str, Any]:
        """Supervised steps on assistant turns (a warm start); one checkpoint at the end."""
        started = time.perf_counter()
        config = request.config
        tokenizer = self.engine.tokenizer
        sequences = []
        for index, example in enumerate(request.trajectories):
            try:
                sequences.append(sft_sequence(tokenizer, example.messages, example.tools))
            except ValueError as error:
                raise InvalidRequestError(
                    f"trajectories[{index}]: {error}", param=f"trajectories[{index}]"
                ) from error
        max_length = config.max_length or self.engine.context_length
        settings = OptimizerSettings.from_config(config)
        losses: list[float] = []
        dropped = 0
        batches = [
            sequences[start : start + config.batch_size]
            for _ in range(config.epochs)
            for start in range(0, len(sequences), config.batch_size)
        ]
        for number, batch in enumerate(batches):
            rows, drops = pack_rows(batch, max_length=max_length, mask_truncated=False)
            dropped += drops["over_length"]
            if rows.num_rows:
                step = await self._in_trainer_thread(model.trainer.sft_step, rows, settings)
                losses.append(step["loss"])
            await progress.put({"type": "progress", "done": number + 1, "total": len(batches)})
        metrics = {
            "loss": losses[-1] if losses else 0.0,
            "loss_first": losses[0] if losses else 0.0,
            "optimizer_steps": float(len(losses)),
            "examples": float(len(sequences)),
            "dropped/over_length": float(dropped),
            "learning_rate": config.learning_rate,
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
        """Record evaluation groups at the current step: history row + trajectories file."""
        rewards = [t.reward for g in request.groups for t in g.trajectories]
        metrics = _reward_metrics(rewards)
        per_metric: dict[str, list[float]] = {}
        non_finite = 0  # a trajectory's inf or NaN metric: left out of its mean, counted
        for group in request.groups:
            for trajectory in group.trajectories:
                for key, value in trajectory.metrics.items():
                    if math.isfinite(value):
                        per_metric.setdefault(key, []).append(value)
                    else:
                        non_finite += 1
        metrics.update({key: _mean_and_std(values)[0] for key, values in per_metric.items()})
        metrics["exceptions"] = float(sum(len(g.exceptions) for g in request.groups))
        metrics["trajectories"] = float(len(rewards))
        for group in request.groups:
            for key, value in group.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
        metrics["dropped/non_finite_metrics"] = float(non_finite)
        metrics = _finite_metrics(metrics)
        model.store.append_history(
            {"type": "log", "split": request.split, "step": model.step, "metrics": metrics}
        )
        await self._in_trainer_thread(
            model.store.write_trajectories,
            request.split,
            model.step,
            trajectory_rows(request.groups),
        )
        return {"step": model.step, "split": request.split, "metrics": metrics}

    async def delete_checkpoints(
        self, model: RegisteredModel, request: DeleteCheckpointsRequest
    ) -> dict[str, Any]:
        """Delete all checkpoints but the latest and the best by a logged metric."""
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
        deleted = []
        async with self._step_lock:
            for step in steps:
                if step in keep:
                    continue
                served_name = model.inference_name(step)
                if served_name in self.engine.adapters:
                    await self._in_trainer_thread(self.engine.unload_adapter, served_name)
                    model.served.remove(step)
                await self._in_trainer_thread(model.store.delete_checkpoint, step)
                deleted.append(step)
        return {"kept": sorted(keep), "deleted": deleted, "best_step": best}


def release_free_memory() -> None:
    """Hand memory freed by a step back to the OS (glibc keeps it otherwise); no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _loss_config(config: TrainSettings):
    overrides: dict[str, Any] = {}
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


def _reward_metrics(rewards: list[float]) -> dict[str, float]:
    if not rewards:
        return {"reward": 0.0, "reward_std": 0.0}
    mean, std = _mean_and_std(rewards)
    return {"reward": mean, "reward_std": std}


def _mean_and_std(values: list[float]) -> tuple[float, float]:
    """Mean and population std of finite values, without overflow near the float limits.

    Computed on values / (their largest magnitude): `fmean([1e308, 1e308, 0])` raises
    OverflowError, the mean of [1, 1, 0] cannot, and neither result can exceed that magnitude.
    """
    scale = max(abs(value) for value in values) or 1.0
    unit = [value / scale for value in values]
    std = statistics.pstdev(unit) * scale if len(unit) > 1 else 0.0
    return statistics.fmean(unit) * scale, std


def _finite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The finite metrics, with `dropped/non_finite_metrics` counting the others (inf, NaN)."""
    finite = {key: value for key, value in metrics.items() if math.isfinite(value)}
    dropped = len(metrics) - len(finite)
    finite["dropped/non_finite_metrics"] = finite.get("dropped/non_finite_metrics", 0.0) + dropped
    return finite


def _check_target_modules(module_names: list[str], targets: list[str]) -> None:
    """400 before anything is saved when lora.target_modules names no module of the model."""
    if unmatched := unmatched_target_modules(module_names, targets):
        known = sorted({name.rsplit(".", 1)[-1] for name in module_names})
        raise InvalidRequestError(
            f"lora.target_modules names {unmatched}, which match no module of the base model; "
            f"its adaptable modules are {', '.join(known)}.",
            param="lora.target_modules",
        )


def _check_advantages(advantages: torch.Tensor, scale_rewards: str) -> None:
    """400 when advantages leave float32, the dtype the trainer computes the loss in."""
    if bool(torch.isfinite(advantages.float()).all()):
        return
    raise InvalidRequestError(
        f"These rewards give advantages too large to train on (scale_rewards={scale_rewards!r} "
        'keeps their magnitude). Rescale the rewards, or use scale_rewards "group" or "batch".',
        param="groups",
    )


def _apply_review(
    group: GroupPayload, review: ReviewState
) -> tuple[list[tuple[TrajectoryPayload, float]] | None, dict[str, dict[str, Any]]]:
    """The group's trajectories that may train, each with its reward after reviewers' decisions.

    None when the whole group is flagged. The second value is what was applied, by trajectory
    id, as annotations of its logged row.
    """
    group_flag = review.group_flag([t.id for t in group.trajectories])
    if group_flag is not None:
        note = {"review": {"applied": "flagged_groups", "reason": group_flag.get("reason")}}
        return None, {t.id: note for t in group.trajectories}
    members: list[tuple[TrajectoryPayload, float]] = []
    applied: dict[str, dict[str, Any]] = {}
    for trajectory in group.trajectories:
        if (flag := review.trajectory_flag(trajectory.id)) is not None:
            applied[trajectory.id] = {
                "review": {"applied": "flagged_trajectories", "reason": flag.get("reason")}
            }
        elif (override := review.override(trajectory.id)) is not None:
            reward = float(override["reward"])
            applied[trajectory.id] = {
                "reward": reward,
                "review": {
                    "applied": "reward_overrides",
                    "reason": override.get("reason"),
                    "submitted_reward": trajectory.reward,
                },
            }
            members.append((trajectory, reward))
        else:
            members.append((trajectory, trajectory.reward))
    return members, applied


def _why_nothing_trained(metrics: dict[str, float]) -> str:
    reasons = [
        f"{int(value)} {key}"
        for key, value in metrics.items()
        if key.startswith(("dropped/", "groups/", "review/"))
        and value
        and key not in ("groups/submitted", "groups/trainable")
    ]
    return ", ".join(reasons) or "no trajectories"
