"""The Tinker API's training semantics over our trainer: a training run is a registered model.

    create_model               -> `ModelRegistry.register` (project "tinker", name = model id):
                                  a LoRA on the served base model, checkpoint 0, served `<id>@0`
    forward_backward           -> `LoraTrainer.forward_backward`: the datums as the trainer's rows
                                  (`_datums`), a loss of `training._losses.LOSSES` (cross_entropy,
                                  importance_sampling, ppo, cispo, dro, gspo, stable_reinforce:
                                  its datums' provenance resolved by `_stability`): gradients
                                  add up until the next optim_step
    optim_step                 -> `LoraTrainer.optim_step` with the step's AdamW settings
    save_weights_for_sampler   -> checkpoint N+1, served `<id>@<N+1>` (`TrainingService.save_step`),
                                  named `tinker://<id>/sampler_weights/<name>` (`_sampling`)

Each operation is checked when it arrives (a 400 the SDK raises as `BadRequestError`, naming what
is wrong), then runs through the futures in its training run's `seq_id` order (`_futures`), on
the trainer's thread while no other step runs (`TrainingService.step_part`). Runs live in this
process; `_run_index` keeps what a restarted server needs to answer for them (sampler paths,
checkpoint lists), and their saved states (`_states`) start new runs.
"""

from __future__ import annotations

import functools
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from art_backend._errors import InvalidRequestError, NotFoundError
from art_backend.engines._engine import Engine
from art_backend.store._checkpoints import fault_point
from art_backend.tinker._datums import datum_rows
from art_backend.tinker._futures import Answer, Futures, RunOrder
from art_backend.tinker._proto import ForwardBackwardWire, encode_forward_backward_output
from art_backend.tinker._run_index import PROJECT, RunIndex, RunRecord
from art_backend.tinker._schemas import CreateModelRequest, OptimStepRequest
from art_backend.tinker._stability import StabilityRecords, resolve_provenance
from art_backend.training._losses import (
    LOSSES,
    NOT_SERVED_YET,
    DatumLoss,
    TinkerLoss,
    resolved_config,
)
from art_backend.training._model_registry import RegisteredModel, check_rank_fits
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._rows import Rows
from art_backend.training._training_service import TrainingService
from art_core.names import check_name
from art_core.types import LoRAConfig
from art_core.wire import RegisterRequest

logger = logging.getLogger("art_backend.tinker")

LORA_ALPHA = 32.0  # Tinker's own, whatever the rank
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


@dataclass
class StepTally:
    """A run's training since its last checkpoint, as the metrics of that checkpoint's history
    row (the history route and the review page show them): the losses summed over forward_backward
    calls, the datums and target tokens they scored, the optimizer steps and the last one's
    gradient norm and learning rate."""

    loss_sum: float = 0.0
    datums: int = 0
    tokens: int = 0
    optim_steps: int = 0
    grad_norm: float | None = None
    learning_rate: float | None = None

    def metrics(self) -> dict[str, float]:
        """The row's metrics; empty when nothing trained (a sampler saved twice)."""
        if not self.datums and not self.optim_steps:
            return {}
        metrics = {
            "loss": self.loss_sum,
            "datums": float(self.datums),
            "trained_tokens": float(self.tokens),
            "optim_steps": float(self.optim_steps),
        }
        if self.grad_norm is not None and self.learning_rate is not None:
            metrics |= {"grad_norm": self.grad_norm, "learning_rate": self.learning_rate}
        return metrics


@dataclass
class TrainingRun:
    """A training client's model: the registered model and its operations' order."""

    model_id: str
    registered: RegisteredModel
    record: RunRecord  # what the index keeps of it
    revived: bool = False  # created before this server started: it samples, it does not train
    order: RunOrder = field(default_factory=RunOrder)
    # seq_id -> (request id, sha256 of the body): a retried operation gets its first answer
    requests: dict[int, tuple[str, str]] = field(default_factory=dict)
    # What the run did since its last checkpoint: the next one's history row carries it.
    since_checkpoint: StepTally = field(default_factory=StepTally)

    @property
    def lora_rank(self) -> int:
        return int(self.record.lora["r"])

    @property
    def samplers(self) -> dict[str, int]:
        """Sampler name -> step."""
        return self.record.samplers


@dataclass(frozen=True)
class PreparedForwardBackward:
    """A forward_backward request checked, with its datums as the trainer's rows."""

    wire: ForwardBackwardWire
    run: TrainingRun
    loss: TinkerLoss
    config: dict[str, float | str]
    rows: Rows


class TinkerTraining:
    """Training runs, created and trained through the Tinker API."""

    def __init__(self, engine: Engine, base_names: list[str], training: TrainingService):
        self.engine = engine
        self.base_names = base_names
        self.training = training
        self.futures = Futures()
        self.runs: dict[str, TrainingRun] = {}
        self.index = RunIndex(training.registry.art_path)
        self.stability = StabilityRecords()  # samplers' records, for provenance (`_stability`)

    def run(self, model_id: str) -> TrainingRun:
        """The training run `model_id` names, to train: 404 when it is unknown (naming only the
        id asked for: the other runs are other callers'), 400 when it was created before the
        server restarted."""
        run = self.runs.get(model_id)
        if run is not None and not run.revived:
            return run
        if model_id in self.index.records:
            raise InvalidRequestError(
                f"Training run {model_id} was created before this server restarted: its "
                "optimizer state and the steps after its last save ended with that process. "
                "Train on from a saved state: service_client.create_training_client_from_state"
                f"(path), the paths listed by rest_client.list_checkpoints({model_id!r}).",
                param="model_id",
            )
        raise NotFoundError(
            f"No training run {model_id!r} on this server. Create one with "
            "create_lora_training_client."
        )

    async def sampled_run(self, model_id: str) -> TrainingRun:
        """The training run `model_id` names, to sample from: a run of before a restart is
        registered again (its model resumes at its latest checkpoint, served)."""
        run = self.runs.get(model_id)
        if run is not None:
            return run
        record = self.index.records.get(model_id)
        if record is None:
            return self.run(model_id)  # the 404
        register = RegisterRequest(
            project=record.project,
            name=record.store_name,
            base_model=record.base_model,
            lora=LoRAConfig(**record.lora),
        )
        await self.training.registry.register(register)
        registered = self.training.registry.get(record.project, record.store_name)
        run = self.runs[model_id] = TrainingRun(model_id, registered, record, revived=True)
        return run

    def check_base_model(self, base_model: str) -> None:
        """A 400 naming the served base model when another one is asked for."""
        if base_model not in self.base_names:
            raise InvalidRequestError(
                f"This server serves base model {self.base_names[0]!r}; the request names "
                f"{base_model!r}. Start art-server with that model, or ask for this one.",
                param="base_model",
            )

    # ------------------------------------------------------------------------------ create_model

    def create_model(self, request: CreateModelRequest) -> str:
        """Check the request, then register the run in a future; the future's request id."""
        self.check_base_model(request.base_model)
        if request.optimizer_config.type != "adamw":
            raise InvalidRequestError(
                f"Optimizer {request.optimizer_config.type!r} is not served; this server's "
                "training runs use AdamW (the SDK's default optimizer).",
                param="optimizer_config",
            )
        lora = request.lora_config
        rank = lora.rank if lora is not None else 32
        check_rank_fits(self.training.trainer_host, rank, param="lora_config.rank")
        modules = [
            *(ATTENTION_MODULES if lora is None or lora.train_attn else ()),
            *(MLP_MODULES if lora is None or lora.train_mlp else ()),
        ]
        if not modules:
            raise InvalidRequestError(
                "This server adapts attention and MLP layers (train_attn, train_mlp); the "
                "unembedding alone (train_unembed) is not served yet.",
                param="lora_config",
            )
        model_id = new_store_name()
        project, name = _store_place(request.user_metadata or {}, model_id)
        register = RegisterRequest(
            project=project,
            name=name,
            base_model=request.base_model,
            lora=LoRAConfig(r=rank, alpha=LORA_ALPHA, target_modules=modules),
            seed=(lora.seed if lora is not None and lora.seed is not None else 0),
        )
        return self.futures.start(self._answer_created(model_id, register, request.session_id))

    async def _answer_created(
        self, model_id: str, register: RegisterRequest, session_id: str
    ) -> Answer:
        await self.register(model_id, register, session_id)
        return Answer({"model_id": model_id, "type": "create_model"})

    async def register(
        self, model_id: str, register: RegisterRequest, session_id: str | None = None
    ) -> TrainingRun:
        """Register a new training run of `session_id`: its model in the store
        (`register.name`), its LoRA."""
        if self.training.team is not None:
            raise InvalidRequestError(
                "The Tinker API trains on one process; this server runs several "
                "(--train-processes). Start it with one."
            )
        if model_id in self.runs or model_id in self.index.records:
            raise InvalidRequestError(f"Training run {model_id!r} exists already.")
        await self.training.registry.register(register)
        registered = self.training.registry.get(register.project, register.name)
        record = RunRecord(
            model_id,
            register.name,
            register.base_model,
            registered.lora,
            register.project,
            session_id=session_id,
        )
        self.index.put(record)
        run = self.runs[model_id] = TrainingRun(model_id, registered, record)
        return run

    def info(self, model_id: str) -> dict[str, Any]:
        """get_info: the run's base model, its tokenizer (the served model's folder), LoRA rank."""
        run = self.run(model_id)
        tokenizer = getattr(getattr(self.engine, "tokenizer", None), "name_or_path", None)
        model_data = {
            "model_name": run.registered.base_model,
            "tokenizer_id": tokenizer or run.registered.base_model,
        }
        return {
            "type": "get_info",
            "model_data": model_data,
            "model_id": model_id,
            "is_lora": True,
            "lora_rank": run.lora_rank,
            "model_name": run.registered.base_model,
        }

    # ------------------------------------------------------------------------ in seq_id order

    def in_order(
        self, run: TrainingRun, seq_id: int | None, work: Callable[[], Awaitable[Answer]]
    ) -> str:
        """Start `work` in the run's seq_id order; its request id."""
        return self.futures.start(run.order.run(seq_id, work))

    def repeated(self, model_id: str | None, seq_id: int | None, digest: str) -> str | None:
        """The request id of the operation this seq_id started before (the SDK retried it),
        or None; a 400 when the seq_id comes back with another body."""
        run = self.runs.get(model_id or "")
        if run is None or seq_id is None or seq_id not in run.requests:
            return None
        request_id, first_digest = run.requests[seq_id]
        if digest != first_digest:
            raise InvalidRequestError(
                f"Operation {seq_id} of training run {run.model_id} was sent before with "
                "another body; an operation's number names one operation.",
                param="seq_id",
            )
        return request_id

    def remember(
        self, model_id: str | None, seq_id: int | None, digest: str, request_id: str
    ) -> None:
        """Keep the operation a seq_id started, for `repeated`."""
        run = self.runs.get(model_id or "")
        if run is not None and seq_id is not None:
            run.requests[seq_id] = (request_id, digest)

    def skip_turn(self, model_id: str | None, seq_id: int | None) -> None:
        """A refused operation still takes its turn, so the ones after it are not held (a run
        that does not exist has no turns)."""
        run = self.runs.get(model_id or "")
        if run is not None and seq_id not in run.requests:
            self.futures.start(run.order.run(seq_id, _nothing))

    # --------------------------------------------------------------------------- forward_backward

    def prepare_forward_backward(self, wire: ForwardBackwardWire) -> PreparedForwardBackward:
        """Check the run, the loss and every datum, and lay the datums out as the trainer's rows:
        the request's expensive part, which touches nothing shared (a route runs it on a worker
        thread for a large request)."""
        run = self.run(wire.model_id)
        loss, config = self._loss(wire)
        if loss.provenance:
            resolve_provenance(wire, self.stability)
        context, vocabulary = self.engine.context_length, self.engine.vocab_size
        rows = datum_rows(wire, loss, vocabulary=vocabulary, context=context)
        return PreparedForwardBackward(wire, run, loss, config, rows)

    def forward_backward(self, prepared: PreparedForwardBackward) -> str:
        """Score the prepared datums (and keep the gradient) in the run's order."""
        wire, run, loss, config, rows = (
            prepared.wire,
            prepared.run,
            prepared.loss,
            prepared.config,
            prepared.rows,
        )
        trainer = run.registered.trainer
        backward = not wire.forward_only

        async def work() -> Answer:
            scoring = DatumLoss(loss, config)
            score = functools.partial(
                trainer.forward_backward, backward=backward, share_trained=True
            )
            try:
                await self.training.step_part(score, rows, scoring, OptimizerSettings())
            except FloatingPointError as error:
                raise InvalidRequestError(
                    f"The loss of these datums is not finite ({error}): nothing of this "
                    "forward_backward was added to the gradient, and the run goes on. Scale "
                    "the advantages or weights down, or check the sampler logprobs sent."
                ) from error
            count = len(wire.data)
            losses = [scoring.losses[number] for number in range(count)]
            total = float(sum(float(values.sum()) for values in losses))
            if backward:
                tally = run.since_checkpoint
                tally.loss_sum += total
                tally.datums += count
                tally.tokens += sum(len(datum.tokens) for datum in wire.data)
            outputs = {
                "logprobs": [scoring.logprobs[number].numpy() for number in range(count)],
                "elementwise_loss": [values.numpy() for values in losses],
            }
            proto = encode_forward_backward_output(outputs, {"loss:sum": total}, count)
            return Answer(proto=proto)

        return self.in_order(run, wire.seq_id or None, work)

    def _loss(self, wire: ForwardBackwardWire) -> tuple[TinkerLoss, dict[str, float | str]]:
        """The loss `wire` names, and its loss_fn_config over the loss's defaults."""
        loss = LOSSES.get(wire.loss_fn)
        if loss is None:
            served = ", ".join(LOSSES)
            later = (
                " It is not served yet." if wire.loss_fn in NOT_SERVED_YET else " It is unknown."
            )
            raise InvalidRequestError(
                f"Loss function {wire.loss_fn!r} is not served by this server.{later} "
                f"Served: {served}.",
                param="loss_fn",
            )
        try:
            return loss, resolved_config(loss, wire.loss_fn_config)
        except ValueError as error:
            raise InvalidRequestError(f"{wire.loss_fn}: {error}.", param="loss_fn_config") from None

    # --------------------------------------------------------------------------------- optim_step

    def optim_step(self, request: OptimStepRequest) -> str:
        """One AdamW step with the run's accumulated gradients, in order."""
        run = self.run(request.model_id)
        if request.adam_params is None:
            kind = (request.optimizer_params or {}).get("type", "unknown")
            raise InvalidRequestError(
                f"Optimizer {kind!r} is not served; send AdamParams (this server's runs use "
                "AdamW).",
                param="optim_params",
            )
        adam = request.adam_params
        settings = OptimizerSettings(
            learning_rate=adam.learning_rate,
            max_grad_norm=adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf,
            weight_decay=adam.weight_decay,
            betas=(adam.beta1, adam.beta2),
            eps=adam.eps,
        )
        trainer = run.registered.trainer

        def step() -> float:
            grad_norm = trainer.optim_step(settings)
            fault_point("tinker_after_optim_step")  # the crash test kills the server here
            return grad_norm

        async def work() -> Answer:
            try:
                grad_norm = await self.training.step_part(step)
            except FloatingPointError as error:
                raise InvalidRequestError(
                    f"The accumulated gradient is not finite ({error}); nothing was updated."
                ) from error
            tally = run.since_checkpoint
            tally.optim_steps += 1
            tally.grad_norm, tally.learning_rate = grad_norm, adam.learning_rate
            return Answer({"metrics": {"grad_norm": grad_norm}, "type": "optim_step"})

        return self.in_order(run, request.seq_id, work)


def new_store_name() -> str:
    """A fresh name for a run's model in the store (project "tinker")."""
    return f"tinker-{uuid.uuid4().hex[:16]}"


def _store_place(metadata: dict[str, Any], model_id: str) -> tuple[str, str]:
    """Where a new run's model lives in the store: project "tinker" under its model id, or the
    model `user_metadata` names with `art_project` and `art_name` (an ART model trained through
    the Tinker API: `art_core.tinker_native`), which a registered model of that name resumes."""
    project = metadata.get("art_project", PROJECT)
    name = metadata.get("art_name", model_id)
    try:
        return check_name(str(project), "art_project"), check_name(str(name), "art_name")
    except ValueError as error:
        raise InvalidRequestError(str(error), param="user_metadata") from error


async def _nothing() -> Answer:
    return Answer({})
