"""Registered models: register, resume and fork; the served-steps window; promotion; deletion.

`ModelRegistry` is the member of `TrainingService` that keeps the backend's models, which of
their steps the engine serves, and which checkpoints stay on disk. It shares the service's step
lock (nothing here moves a model while a step commits) and its trainer thread (model work).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_backend._errors import (
    ConflictError,
    InvalidRequestError,
    ModelNotRegisteredError,
    NotFoundError,
    TrainerStateError,
)
from art_backend.engines._adapter_files import unmatched_target_modules
from art_backend.engines._aliases import alias_pins
from art_backend.engines._engine import Engine, TrainableEngine
from art_backend.store._checkpoints import ModelStore
from art_backend.store._review_decisions import remove_all_pending
from art_backend.training._adapter_start import adapter_source, copy_adapter
from art_backend.training._distributed import TrainingTeam
from art_backend.training._replay_record import record_model
from art_backend.training._trainer import LoraTrainer
from art_backend.training._trainer_state import TRAINER_STATE, read_trainer_state
from art_core.wire import (
    DeleteCheckpointsRequest,
    HoldStepRequest,
    PromoteRequest,
    RegisterRequest,
)

logger = logging.getLogger("art_backend.training")


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
    # The step the plain name serves: the latest, unless a promotion gate refused later steps
    # (it stays loaded outside the window, and its checkpoint is never deleted).
    promoted: int = 0
    # Steps adapter leases hold (how many leases each): served and never deleted while held.
    holds: Counter[int] = field(default_factory=Counter)

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
            "promoted_step": self.promoted,
            "checkpoints": self.store.checkpoint_steps(),
            "lora": self.lora,
        }


class ModelRegistry:
    """The models `TrainingService` registered, their served steps and their checkpoints."""

    def __init__(
        self,
        engine: Engine,
        trainer_host: TrainableEngine,
        *,
        art_path: Path,
        base_names: list[str],
        step_lock: asyncio.Lock,
        in_trainer_thread: Callable[..., Awaitable[Any]],
        team: TrainingTeam | None = None,
    ) -> None:
        """`step_lock` and `in_trainer_thread` are the service's: one step at a time on the
        engine, model work on the trainer's thread. `team`: the training processes, if several."""
        self.engine = engine
        self.trainer_host = trainer_host
        self.art_path = art_path
        self.base_names = base_names
        self.team = team
        self.models: dict[tuple[str, str], RegisteredModel] = {}
        self._adapter_numbers = itertools.count()
        self._step_lock = step_lock
        self._in_trainer_thread = in_trainer_thread

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
        # The model's width first: a rank past it is never right, whatever the engine holds.
        check_rank_fits(self.trainer_host, request.lora.r, param="lora.r")
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
        adapter = (
            adapter_source(request)
            if latest is None and fork is None and request.init_adapter
            else None
        )
        lora = request.lora.model_dump()
        if saved is not None and saved["lora"] != lora:
            logger.warning("%s: keeping the saved LoRA settings %s", request.name, saved["lora"])
            lora = saved["lora"]
        trainer = LoraTrainer(
            self.trainer_host, f"train_{next(self._adapter_numbers)}", lora, seed=request.seed
        )
        try:
            if fork is not None:
                latest = self._copy_fork(*fork, store)
            elif adapter is not None:
                store.write_checkpoint(
                    0, copy_adapter(adapter), {"kind": "initial", "source": str(adapter)}
                )
                latest = 0
            if latest is None:
                store.write_checkpoint(0, trainer.save, {"kind": "initial"})
                latest = 0
            trainer.load(store.checkpoint_dir(latest))
        except BaseException:
            trainer.close()  # its adapter must not stay in the engine's model
            raise
        # Only now: a model.json written before a failed load would claim this base model for
        # checkpoints that do not fit it.
        if saved is None:
            store.write_model_config({"base_model": request.base_model, "lora": lora})
        model = RegisteredModel(
            store, trainer, latest, request.base_model, lora, served_steps=request.served_steps
        )
        model.promoted = _saved_promotion(store, latest)
        # Steps the server already serves (found at startup) count toward the served window.
        model.served = sorted(
            step
            for step in store.checkpoint_steps()
            if model.inference_name(step) in self.engine.adapters and step != latest
        )
        self.models[(request.project, request.name)] = model
        self.serve_step(model, latest)
        if model.inference_name(model.promoted) not in self.engine.adapters:
            self.serve_step(model, model.promoted)
        self.pin(model)
        record_model(self, model, request.seed)  # manifest.json: what `art replay` checks against
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

    def serve_step(self, model: RegisteredModel, step: int) -> None:
        """Load checkpoint `step` into the engine as `<name>@<step>`; the window keeps its size."""
        self._load_served(model, step)
        self._trim_served(model)

    async def serve_again(self, model: RegisteredModel, step: int) -> None:
        """Serve an older step once more (a Tinker sampler of it): loaded and counted in the
        served window, which is not trimmed now (the sampler is about to use it), so the
        window's next trim unloads it again."""
        async with self._step_lock:  # as `promote`: not while a step commits
            if model.inference_name(step) not in self.engine.adapters:
                await self._in_trainer_thread(self._load_served, model, step)

    def _load_served(self, model: RegisteredModel, step: int) -> None:
        self.engine.load_adapter(model.inference_name(step), model.store.checkpoint_dir(step))
        model.served = sorted({*model.served, step})  # a promoted step may come back: in order

    def _trim_served(self, model: RegisteredModel) -> None:
        """Unload the steps older than the window; the promoted step stays, even outside it."""
        keep = {*model.served[-model.served_steps :], model.promoted, *model.holds}
        for old in [step for step in model.served if step not in keep]:
            model.served.remove(old)
            if model.inference_name(old) in self.engine.adapters:
                self.engine.unload_adapter(model.inference_name(old))

    async def hold(self, model: RegisteredModel, request: HoldStepRequest) -> dict[str, Any]:
        """Take or give back a hold on a step (an adapter lease): a held step is loaded, stays
        served beyond the window, and is not deleted; the answer lists the held steps."""
        step = request.step
        if request.release:
            await self.give_back(model, step)
            return {"held": sorted(model.holds)}
        if step not in (steps := model.store.checkpoint_steps()):
            raise InvalidRequestError(
                f"{model.name} has no checkpoint for step {step} to hold; its checkpoints are "
                f"{steps}.",
                param="step",
            )
        model.holds[step] += 1
        await self.serve_again(model, step)
        return {"held": sorted(model.holds)}

    async def give_back(self, model: RegisteredModel, step: int, *, trim: bool = True) -> None:
        """Give back one hold on `step`; with `trim`, a step no longer held and outside the
        served window is unloaded at once, else at the window's next trim (a Tinker sample:
        the next sample of the same older sampler finds it loaded)."""
        if model.holds[step] > 0:
            model.holds[step] -= 1
        if model.holds[step] <= 0:
            del model.holds[step]
            if trim:
                async with self._step_lock:
                    await self._in_trainer_thread(self._trim_served, model)

    def check_train_from(self, model: RegisteredModel, step: int | None) -> None:
        """A train request's `train_from_step`: a step on disk (None or the latest: as usual)."""
        if step is None or step == model.step:
            return
        if self.team is not None:
            raise InvalidRequestError(
                "train_from_step: training from an earlier step is not supported with several "
                "training processes (--train-processes); use train_from='latest'.",
                param="train_from_step",
            )
        if step not in (steps := model.store.checkpoint_steps()):
            raise InvalidRequestError(
                f"train_from_step: {model.name} has no checkpoint for step {step}; its "
                f"checkpoints are {steps}.",
                param="train_from_step",
            )

    def load_trainer(self, model: RegisteredModel, step: int) -> None:
        """Put checkpoint `step` into the trainer (on the trainer's thread): its adapter, and its
        optimizer state where kept (`prune_trainer_states`), else fresh optimizer moments."""
        folder = model.store.checkpoint_dir(step)
        model.trainer.load(folder)
        if not (folder / TRAINER_STATE).is_file():
            model.trainer.optimizer.state.clear()  # not the moments of the step left behind

    def prune_trainer_states(self, model: RegisteredModel) -> None:
        """Optimizer state (2x the adapter) stays in the latest and the promoted checkpoints:
        resume needs the one, training again from the promoted step the other."""
        for step in model.store.checkpoint_steps():
            if step not in (model.step, model.promoted):
                (model.store.checkpoint_dir(step) / TRAINER_STATE).unlink(missing_ok=True)

    def pin(self, model: RegisteredModel) -> None:
        """Point the model's plain name at its promoted step (`engines._aliases`)."""
        alias_pins(self.engine)[model.name] = model.inference_name(model.promoted)

    async def promote(self, model: RegisteredModel, request: PromoteRequest) -> dict[str, Any]:
        """A gate's verdict on a step: promote=True points the plain name at it (loading it if
        it was unloaded); either way one "promotion" history row. 404 for a step not on disk."""
        async with self._step_lock:  # not while a step commits: model.step and served hold still
            steps = model.store.checkpoint_steps()
            if request.step not in steps:
                raise NotFoundError(
                    f"{model.name} has no checkpoint for step {request.step}; its checkpoints "
                    f"are {steps}. Promote one of those.",
                    param="step",
                )
            if request.promote:
                if model.inference_name(request.step) not in self.engine.adapters:
                    await self._in_trainer_thread(self.serve_step, model, request.step)
                model.promoted = request.step
                self.pin(model)
            model.store.append_history(
                {
                    **request.details,
                    "type": "promotion",
                    "step": request.step,
                    "promoted": request.promote,
                    "promoted_step": model.promoted,
                    "metrics": request.metrics,
                }
            )
        return model.info()

    def get(self, project: str, name: str) -> RegisteredModel:
        model = self.models.get((project, name))
        if model is None:
            raise ModelNotRegisteredError(
                f"Model {project}/{name} is not registered on this backend: "
                "call `await model.register(backend)` first."
            )
        return model

    async def delete_checkpoints(
        self, model: RegisteredModel, request: DeleteCheckpointsRequest
    ) -> dict[str, Any]:
        """Delete all checkpoints but the latest and the best by a logged metric, or exactly
        `request.steps` (a retention strategy's choice); either way not `request.keep` (a
        client's adapter leases), which the answer's `held` names where it saved a step."""
        request = request.model_copy(update={"keep": [*request.keep, *model.holds]})
        if request.steps is not None:
            held = sorted(set(request.steps) & set(request.keep))
            asked = sorted(set(request.steps) - set(held))
            return {**await self._delete_steps(model, asked), "held": held}
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
        keep = {model.step, model.promoted, *([best] if best is not None else [])}
        held = sorted(set(request.keep) & set(steps) - keep)  # a client's leases keep these too
        async with self._step_lock:
            deleted = await self._delete_unlocked(
                model, [s for s in steps if s not in keep and s not in held]
            )
        return {
            "kept": sorted(keep | set(held)),
            "deleted": deleted,
            "best_step": best,
            "held": held,
        }

    async def _delete_steps(self, model: RegisteredModel, steps: list[int]) -> dict[str, Any]:
        async with self._step_lock:  # model.step cannot move while the choice is checked
            if model.step in steps:
                raise InvalidRequestError(
                    f"Step {model.step} is {model.name}'s latest step, which it serves and trains "
                    "from; it is never deleted. Leave it out of steps.",
                    param="steps",
                )
            if model.promoted in steps:
                raise InvalidRequestError(
                    f"Step {model.promoted} is the step {model.name}'s plain name serves (its "
                    "promoted step); it is never deleted. Promote another step first, or leave "
                    "it out of steps.",
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


def _saved_promotion(store: ModelStore, latest: int) -> int:
    """The promoted step a resumed model had (its history's last word on it), if still on disk;
    else the latest step."""
    steps = set(store.checkpoint_steps())
    for row in reversed(store.read_history()):
        if "promoted_step" in row:
            return row["promoted_step"] if row["promoted_step"] in steps else latest
        if row.get("type") in ("train", "sft"):  # a row rebuilt after a crash says nothing
            return latest
    return latest


def _check_target_modules(module_names: list[str], targets: list[str]) -> None:
    """400 before anything is saved when lora.target_modules names no module of the model."""
    if unmatched := unmatched_target_modules(module_names, targets):
        known = sorted({name.rsplit(".", 1)[-1] for name in module_names})
        raise InvalidRequestError(
            f"lora.target_modules names {unmatched}, which match no module of the base model; "
            f"its adaptable modules are {', '.join(known)}.",
            param="lora.target_modules",
        )


def check_rank_fits(trainer_host: Any, rank: int, *, param: str) -> None:
    """400 when a LoRA rank exceeds the base model's width (its hidden size): such a rank adds
    memory, never expressiveness. Every route that creates an adapter asks here."""
    model = getattr(trainer_host, "model", None)
    width = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(width, int) and rank > width:
        raise InvalidRequestError(
            f"LoRA rank {rank} exceeds the width of the base model (hidden size {width}); give "
            f"a rank of at most {width}.",
            param=param,
        )


def _check_rank(max_rank: int | None, rank: int) -> None:
    """400 at registration when the serving engine cannot hold an adapter of this rank."""
    if max_rank is not None and rank > max_rank:
        raise InvalidRequestError(
            f"lora.r is {rank}, above the vLLM engine's --max-lora-rank {max_rank}: register "
            f"with lora.r <= {max_rank}, or restart art-server with --max-lora-rank {rank}.",
            param="lora.r",
        )
