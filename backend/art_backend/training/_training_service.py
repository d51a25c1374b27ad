"""Training orchestration: one queue of steps, groups -> rows -> GRPO -> step N+1.

The flow of one `train` call, top to bottom in `TrainingService.train`:
  recorded completions of each trajectory, reviewers' decisions applied (`_prepared_step`,
  `_review_veto`) -> advantages per group (`_grpo`) -> token rows (`_rows`) -> one optimizer
  step (`_trainer`) -> checkpoint N+1 written atomically (`_commit_step`, `store._checkpoints`)
  -> served as `<name>@<N+1>` -> history row and trajectories logged.
Anything not trained is counted in the step's metrics under `dropped/...` or `groups/...`.
The service holds two members: `registry` (`_model_registry.ModelRegistry`: registered models,
their served steps, promotion and checkpoint deletion) and `step_log` (`_step_log.StepLog`: `log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from art_backend._errors import BackendError, InvalidRequestError
from art_backend.engines._engine import Engine, TrainableEngine
from art_backend.store._checkpoints import (
    STEP_TRAJECTORIES,
    fault_point,
    write_trajectory_rows,
)
from art_backend.store._records import CompletionRecords
from art_backend.store._review_decisions import read_review_state
from art_backend.training._distributed import TrainingTeam
from art_backend.training._grpo import LossConfig, loss_preset
from art_backend.training._model_registry import ModelRegistry, RegisteredModel
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._prepared_step import (
    PreparedStep,
    check_rewards,
    prepare_step,
    why_nothing_trained,
)
from art_backend.training._replay_record import StepInputs, index_step, write_step_files
from art_backend.training._rows import Rows, pack_rows, sft_sequences
from art_backend.training._step_log import StepLog, trajectory_rows
from art_backend.training._trainer import LoraTrainer
from art_backend.training._trainer_thread import TrainerThread
from art_core.types import TrainConfig
from art_core.wire import SFTRequest, TrainRequest


class TrainingService:
    """Runs registered models' training steps one at a time, beside the engine."""

    def __init__(
        self,
        engine: Engine,
        records: CompletionRecords,
        *,
        art_path: Path,
        base_names: list[str],
        trainer_host: TrainableEngine | None = None,
        team: TrainingTeam | None = None,
    ) -> None:
        """`engine` serves; `trainer_host` holds the model the trainer updates. They are one
        object for the torch engine (colocated: the trainer borrows the served weights between
        decode steps) and two for an engine in another process (vLLM), which then loads each
        new step's adapter from its checkpoint folder. With `team`, every step also runs on
        the team's other processes (`_distributed`); this process is rank 0, which alone
        saves checkpoints and tells the engine."""
        if trainer_host is None:
            if not isinstance(engine, TrainableEngine):
                raise TypeError(f"{type(engine).__name__} cannot train: pass a trainer_host")
            trainer_host = engine
        self.engine = engine
        self.trainer_host = trainer_host
        self.records = records
        self.team = team
        self.steps_total = 0
        self._step_lock = asyncio.Lock()  # one training step at a time on this engine
        self._waiting = 0
        # Model work of training: one call at a time, each on a thread that exits after it,
        # a step's forward and backward on the engine's thread (why: _trainer_thread.py).
        self._trainer_thread = TrainerThread(host=trainer_host)
        self.registry = ModelRegistry(
            engine,
            trainer_host,
            art_path=art_path,
            base_names=base_names,
            step_lock=self._step_lock,
            in_trainer_thread=self._in_trainer_thread,
            team=team,
        )
        self.step_log = StepLog(self._in_trainer_thread)

    async def _in_trainer_thread(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._trainer_thread.run(function, *args, **kwargs)

    async def _on_model_thread(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """A step's model work (forward, backward, optimizer): on the engine's thread."""
        return await self._trainer_thread.run_on_model(function, *args, **kwargs)

    def _trainer_step(
        self, trainer: LoraTrainer, step: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """`step(trainer, ...)` (`LoraTrainer.grpo_step` or `sft_step`): here, or on every rank
        of the team."""
        if self.team is not None:
            return self.team.run(trainer, step, *args, **kwargs)
        return step(trainer, *args, **kwargs)

    def stop_team(self) -> None:
        """Stop the team's other processes (on shutdown, after the last step)."""
        if self.team is not None:
            self.team.stop()

    def _engine_paused(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """An engine sharing one GPU with the trainer (vLLM sleep mode) sleeps during a step."""
        paused = getattr(self.engine, "paused", None)
        return paused() if paused is not None else contextlib.nullcontext()

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

    async def step_part(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the trainer's thread while no other step runs: one part of a step
        that a client drives part by part (the Tinker API's forward_backward, optim_step)."""
        async with self._step_lock, self._engine_paused():
            return await self._on_model_thread(function, *args)

    async def save_step(
        self,
        model: RegisteredModel,
        kind: str,
        details: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
    ) -> int:
        """Checkpoint the trainer's adapter as step N+1 and serve it as `<name>@<N+1>`, outside
        a train call (the Tinker API's save_weights_for_sampler); returns N+1."""
        async with self._step_lock:
            await self._commit_step(model, kind, metrics or {}, details=details)
        return model.step

    def validate_train(self, project: str, name: str, request: TrainRequest) -> RegisteredModel:
        """Checks that need no model work: a bad request fails before it is queued."""
        model = self.registry.get(project, name)
        loss_config = loss_config_for(request.config)  # raises on an inconsistent preset override
        if not request.groups:
            raise InvalidRequestError("No trajectory groups to train on.", param="groups")
        check_rewards(request.groups, loss_config.scale_rewards)
        self.registry.check_train_from(model, request.train_from_step)
        return model

    async def train(
        self, model: RegisteredModel, request: TrainRequest, progress: asyncio.Queue
    ) -> dict[str, Any]:
        """One GRPO step; returns {"step", "metrics", "warnings", "advantages", "promoted_step"}.

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
        loss_config = _step_loss(loss_config, step, request.config)
        rows = self._pack(step, request.config)
        await progress.put({"type": "progress", "stage": "rows", "rows": rows.num_rows})
        if rows.num_rows == 0:
            return _nothing_trained(model, step, started)
        settings = _step_settings(request.config, trained_trajectories=sum(step.trainable))
        from_step = model.step if request.train_from_step is None else request.train_from_step
        if from_step != model.step:  # a gate's train_from="promoted": back to that adapter
            await self._in_trainer_thread(self.registry.load_trainer, model, from_step)
        replay = StepInputs.before_step(
            self.trainer_host, model.trainer, rows, loss_config, settings, request, from_step
        )
        try:
            step.metrics.update(
                await self._optimizer_step(
                    model, rows, loss_config, settings, step, beta=request.config.beta
                )
            )
        except Exception:
            if from_step != model.step:  # nothing trained: the trainer holds the latest again
                await self._in_trainer_thread(self.registry.load_trainer, model, model.step)
            raise
        replay.after_step()
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
            details={"loss": dataclasses.asdict(loss_config), "trained_from": from_step},
            promote=request.promote,
            replay=replay,
        )
        answer = step.answer(model.step, str(model.store.checkpoint_dir(model.step)))
        return {**answer, "promoted_step": model.promoted}

    def _pack(self, step: PreparedStep, config: TrainConfig) -> Rows:
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
                return await self._on_model_thread(
                    self._trainer_step,
                    model.trainer,
                    LoraTrainer.grpo_step,
                    rows,
                    loss_config,
                    settings,
                    beta=beta,
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
        promote: bool = True,
        replay: StepInputs | None = None,
    ):
        """Checkpoint N+1 atomically, serve it, log its trajectories, then record it in history
        (its row: type, step, metrics, `details`, and the promoted step). `promote=False`
        leaves the plain name on the promoted step (a promotion gate judges N+1 first).

        The trajectories it trained on ride in the checkpoint too: a crash before the history
        row is written is repaired from the checkpoint, trajectories included (`repair_history`).
        """
        new_step = model.step + 1

        def write_files(folder: Path) -> None:
            model.trainer.save(folder)
            if trajectories is not None:
                write_trajectory_rows(folder / STEP_TRAJECTORIES, trajectories)
            # What `art replay` needs, in the checkpoint itself (`_replay_record`).
            write_step_files(folder, model.store, new_step, kind, replay, metrics)

        await self._in_trainer_thread(
            model.store.write_checkpoint,
            new_step,
            write_files,
            {"kind": kind, "metrics": metrics, "written_at": time.time()},
        )
        await self._in_trainer_thread(index_step, model.store, new_step)
        model.step = new_step
        if promote:
            model.promoted = new_step
        # Optimizer state (2x the adapter) is needed only to resume (and to train again from
        # the promoted step), the trajectories copy only to repair the newest step.
        await self._in_trainer_thread(self.registry.prune_trainer_states, model)
        await self._in_trainer_thread(model.store.prune_file, STEP_TRAJECTORIES, keep_step=new_step)
        await self._in_trainer_thread(self.registry.serve_step, model, new_step)
        self.registry.pin(model)
        fault_point("before_trajectories")
        if trajectories is not None:  # the rollouts of step N trained into N+1
            await self._in_trainer_thread(
                model.store.write_trajectories, "train", new_step - 1, trajectories
            )
        fault_point("before_history")
        model.store.append_history(
            {
                "type": kind,
                "step": new_step,
                "metrics": metrics,
                **(details or {}),
                "promoted_step": model.promoted,
            }
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
        sequences = sft_sequences(self.engine.tokenizer, request)
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
                settings = OptimizerSettings.from_config(config, learning_rate=rate)
                async with self._engine_paused():
                    result = await self._on_model_thread(
                        self._trainer_step, model.trainer, LoraTrainer.sft_step, rows, settings
                    )
                losses.append(result["loss"])
                trained_tokens += int(result["trained_tokens"])
            await progress.put({"type": "progress", "done": number + 1, "total": len(batches)})
        if not losses:
            raise InvalidRequestError(
                f"Nothing to train: all {len(sequences)} examples are longer than {max_length} tokens."
            )
        metrics = {
            "loss": losses[-1],
            "loss_first": losses[0],
            "optimizer_steps": float(len(losses)),
            "examples": float(len(sequences)),
            "trained_tokens": float(trained_tokens),
            "batch_size": float(batch_size),
            "dropped/over_length": float(dropped),
            # The last batch's rate: where a schedule ended (the peak is the user's own number).
            "learning_rate": rates[-1],
            "step_seconds": time.perf_counter() - started,
        }
        await self._commit_step(model, "sft", metrics)
        return {
            "step": model.step,
            "metrics": metrics,
            "warnings": [],
            "promoted_step": model.promoted,
        }


def _step_loss(loss_config: LossConfig, step: PreparedStep, config: TrainConfig) -> LossConfig:
    """The loss of this step: TRL's denominators with its untrained rows where asked; a warning
    where truncated importance sampling cannot apply."""
    if config.zero_variance_in_denominator:
        tokens, sequences = step.untrained()
        loss_config = dataclasses.replace(
            loss_config, untrained_tokens=tokens, untrained_rows=sequences
        )
    if config.truncated_importance_sampling and not loss_config.precalculate_logprobs:
        step.warnings.append(
            "truncated_importance_sampling was not applied: it weighs the trainer's logprobs "
            "against the sampler's, so it needs precalculate_logprobs=True (ART skips it "
            "likewise)."
        )
    return loss_config


def _step_settings(config: TrainConfig, *, trained_trajectories: int) -> OptimizerSettings:
    """The optimizer settings of a GRPO step, with ART's
    num_trajectories_learning_rate_multiplier_power: lr x (trained trajectories)^p."""
    settings = OptimizerSettings.from_config(config)
    power = config.num_trajectories_learning_rate_multiplier_power
    if power:
        learning_rate = settings.learning_rate * trained_trajectories**power
        settings = dataclasses.replace(settings, learning_rate=learning_rate)
    return settings


def _nothing_trained(model: RegisteredModel, step: PreparedStep, started: float) -> dict[str, Any]:
    """The answer of a step that trained no row: a warning saying why, a "train_skipped" row."""
    reason = why_nothing_trained(step.metrics)
    step.warnings.append(f"Nothing trained this step: {reason}. The step stays {model.step}.")
    step.metrics.update(trained=0.0, step_seconds=time.perf_counter() - started)
    model.store.append_history(
        {"type": "train_skipped", "step": model.step, "metrics": step.metrics, "reason": reason}
    )
    return {**step.answer(model.step), "promoted_step": model.promoted}


def loss_config_for(config: TrainConfig) -> LossConfig:
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
