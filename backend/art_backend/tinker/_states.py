"""Training state through the Tinker API: `save_state`, `load_state`, and training clients
created from a saved state (`create_training_client_from_state[_with_optimizer]`).

A state is what `LoraTrainer.save` writes (the adapter, the optimizer's moments, the RNG) plus
`tinker_state.json` (the base model and LoRA settings), in
`<--path>/tinker/states/<run's model name>/<name>/`, written into a temporary folder and renamed
into place whole, so a killed server leaves the state before or the state after, never half of
one. Its path is `tinker://<model id>/weights/<name>`.

`load_weights` with a session (a new training client) registers a run with the state's LoRA
settings, under the model id the SDK derives (`<session id>:train:<n>`), and loads the state
into its trainer: the adapter always, the optimizer's moments with `optimizer=True` only.
`load_weights` with a model id (`load_state`) loads into that run, in its order. A restarted
server finds its states again by their `tinker_state.json` (which holds the path), and first
finishes what a kill interrupted: an overwrite caught between its two renames gets its older
state back, and a half-written temporary folder is removed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_backend._errors import InvalidRequestError, NotFoundError
from art_backend.store._checkpoints import fault_point, inside
from art_backend.tinker._futures import Answer
from art_backend.tinker._run_index import check_ttl, expiry
from art_backend.tinker._schemas import LoadWeightsRequest, SaveWeightsRequest
from art_backend.tinker._service import PROJECT, TinkerTraining, TrainingRun, new_store_name
from art_backend.training._trainer import LoraTrainer
from art_core.names import check_name
from art_core.types import LoRAConfig
from art_core.wire import RegisterRequest

logger = logging.getLogger("art_backend.tinker")

STATE_FILE = "tinker_state.json"
WEIGHTS_PATH = "tinker://{model_id}/weights/{name}"


@dataclass(frozen=True)
class SavedState:
    """A state on disk, and what a run must be to load it."""

    folder: Path
    base_model: str
    lora: dict[str, Any]


class TinkerStates:
    """Saved training states by path, over one `TinkerTraining`."""

    def __init__(self, training: TinkerTraining):
        self.training = training
        self.root = training.training.registry.art_path / PROJECT / "states"
        self.saved: dict[str, SavedState] = found_states(self.root)

    def save(self, request: SaveWeightsRequest) -> str:
        """Write the run's state under `request.path` (a name), in the run's order."""
        run = self.training.run(request.model_id)
        try:
            name = check_name(request.path or "", "state name")
            path = WEIGHTS_PATH.format(model_id=run.model_id, name=name)
            if path in self.saved and not request.overwrite:
                raise ValueError(f"state {path} exists; save with overwrite=True to replace it")
        except ValueError as error:
            raise InvalidRequestError(str(error), param="path") from error
        ttl = _checked_ttl(request.ttl_seconds)
        art_path = self.training.training.registry.art_path
        folder = inside(art_path, PROJECT, "states", run.registered.name, name)
        state = SavedState(folder, run.registered.base_model, run.registered.lora)
        record = {"base_model": state.base_model, "lora": state.lora, "path": path}

        async def work() -> Answer:
            trainer = run.registered.trainer
            await self.training.training.step_part(write_state, trainer, folder, record)
            self.saved[path] = state
            run.record.expires.pop(f"weights/{name}", None)  # an overwrite starts afresh
            if ttl is not None:
                run.record.expires[f"weights/{name}"] = expiry(ttl)
            self.training.index.put(run.record)
            return Answer({"path": path, "type": "save_weights"})

        return self.training.in_order(run, request.seq_id, work)

    def load(self, request: LoadWeightsRequest) -> tuple[str, str]:
        """Load a saved state into a new run or into `request.model_id`'s: (request id, model id)."""
        run = self.training.run(request.model_id or "") if request.session_id is None else None
        state = self.saved.get(request.path)
        if state is None:
            raise NotFoundError(  # naming only the path asked for: the others are others'
                f"No saved state {request.path!r} on this server. Save one with save_state "
                "(its path: tinker://<model id>/weights/<name>)."
            )
        if run is not None:

            async def into_run() -> Answer:
                await self._load(run, request.path, request.optimizer)
                return Answer({"path": request.path, "type": "load_weights"})

            return self.training.in_order(run, request.seq_id, into_run), run.model_id
        self.training.check_base_model(request.base_model or state.base_model)
        self.training.check_base_model(state.base_model)  # a state of another base model
        if request.optimizer_config is not None and request.optimizer_config.type != "adamw":
            raise InvalidRequestError(
                f"Optimizer {request.optimizer_config.type!r} is not served; training runs use "
                "AdamW.",
                param="optimizer_config",
            )
        model_id = f"{request.session_id}:train:{request.model_seq_id or 0}"
        work = self._new_run(model_id, state, request)
        return self.training.futures.start(work), model_id

    async def _new_run(
        self, model_id: str, state: SavedState, request: LoadWeightsRequest
    ) -> Answer:
        register = RegisterRequest(
            project=PROJECT,
            name=new_store_name(),
            base_model=state.base_model,
            lora=LoRAConfig(**state.lora),
        )
        run = await self.training.register(model_id, register, request.session_id)
        await self._load(run, request.path, request.optimizer)
        return Answer({"path": request.path, "model_id": model_id, "type": "load_weights"})

    async def _load(self, run: TrainingRun, path: str, optimizer: bool) -> None:
        state = self.saved.get(path)
        if state is None:  # deleted while the load waited for its turn
            raise NotFoundError(
                f"The saved state {path} was deleted (rest_client.delete_checkpoint) after this "
                "load was asked for; load a state that exists."
            )
        if state.lora != run.registered.lora:
            raise InvalidRequestError(
                f"The state's LoRA settings {state.lora} are not this run's "
                f"{run.registered.lora}; create a training client from the state instead."
            )
        await self.training.training.step_part(
            read_state, run.registered.trainer, state.folder, optimizer
        )


def _checked_ttl(ttl_seconds: int | None) -> int | None:
    """A save's `ttl_seconds` within Tinker's bounds (a 400 naming it otherwise)."""
    try:
        return None if ttl_seconds is None else check_ttl(ttl_seconds)
    except ValueError as error:
        raise InvalidRequestError(f"{error}.", param="ttl_seconds") from None


def write_state(trainer: LoraTrainer, folder: Path, record: dict[str, Any]) -> None:
    """The trainer's state into `folder`, whole or not at all (an older one is replaced)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    trainer.save(temporary)
    (temporary / STATE_FILE).write_text(json.dumps(record))
    fault_point("tinker_before_state_rename")  # the crash test kills the server here
    if folder.exists():  # overwrite: the old state steps aside, then goes
        old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(folder, old)
        os.rename(temporary, folder)
        shutil.rmtree(old)
    else:
        os.rename(temporary, folder)


def found_states(root: Path) -> dict[str, SavedState]:
    """The states saved under `root` (`<run's model>/<name>/`), by path, after finishing what a
    killed server left: `.old-<name>-*` alone goes back to `<name>`, `.tmp-*` goes."""
    saved: dict[str, SavedState] = {}
    for run_folder in sorted(root.glob("*")) if root.is_dir() else []:
        for leftover in sorted(run_folder.glob(".old-*")):
            name = leftover.name.removeprefix(".old-").rsplit("-", 1)[0]
            if not (run_folder / name).exists():
                os.rename(leftover, run_folder / name)
            else:
                shutil.rmtree(leftover)
        for leftover in run_folder.glob(".tmp-*"):
            shutil.rmtree(leftover)
        for state_file in sorted(run_folder.glob(f"*/{STATE_FILE}")):
            try:
                record = json.loads(state_file.read_text())
                state = SavedState(state_file.parent, record["base_model"], record["lora"])
                saved[record["path"]] = state
            except (ValueError, KeyError, TypeError) as error:  # never loaded, left where it is
                logger.warning("Skipping the Tinker state %s: %s", state_file.parent, error)
    return saved


def read_state(trainer: LoraTrainer, folder: Path, optimizer: bool) -> None:
    """A saved state into the trainer: the adapter, and the optimizer's moments if asked."""
    trainer.load(folder)
    if not optimizer:
        trainer.optimizer.state.clear()
