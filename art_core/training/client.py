"""ART main's `art.training.TrainingClient`: Tinker's primitive for an ART model, on our core.

    client = await art.training.TrainingClient.create(model)        # a registered model
    fb = await client.forward_backward(ForwardBackwardRequest(
        run_id=client.run_id, request_id="fb-1", sequence_id=0,
        batch=RlTrajectoryBatch(groups=groups), loss=LossConfig(name="cispo")))
    step = await client.optim_step(OptimStepRequest(
        run_id=client.run_id, request_id="step-1", sequence_id=1,
        optimizer=AdamConfig(learning_rate=1e-5)))
    (await fb.result()).loss_fn_outputs, (await step.result()).checkpoint.learner_version

Each call admits its command in the run's order (`RunCommandLedger`: a retry with the same
`request_id` and body gets the first answer; out of order is `TrainingCommandError`) and
returns a `TrainingOperation` at once; `await op.result()` waits for it. Operations reach the
server in the order they were admitted, whatever their preparation takes. Underneath is the
art-server's Tinker API, the model's own training run there (the Tinker run named after the
model, which the server trains with `LoraTrainer.forward_backward` and `optim_step`, the one
core every route shares); saved sampler weights are the model's next served step
`<name>@<step>`.

What differs from ART main: the batch is trajectories whose tokens are the server's records of
their completions (or an input object storing those rows); `forward`'s and
`forward_backward`'s `packing` describes the rows sent (the server packs rows sharing a prompt
itself); `cancel()` withdraws an operation not yet sent, and one already sent runs to its end
(the server keeps no half-applied step).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from art_core.errors import TrainingCommandError
from art_core.training._rows import rl_rows, sft_rows
from art_core.training._tinker_calls import TinkerRun, open_tinker_run, packing_of
from art_core.training.contracts import (
    CheckpointRef,
    Contract,
    ForwardBackwardRequest,
    ForwardBackwardResult,
    ForwardRequest,
    ForwardResult,
    LoadStateRequest,
    LoadStateResult,
    LossFnOutput,
    OperationKind,
    OperationRef,
    OptimStepRequest,
    OptimStepResult,
    RlTrajectoryBatch,
    RunCommand,
    SamplerWeightsResult,
    SaveStateRequest,
    SaveStateResult,
    SaveWeightsForSamplerRequest,
    SupervisedTrajectoryBatch,
    TrainingInputObjectRef,
)
from art_core.training.input_objects import LocalInputStore
from art_core.training.sequencing import RunCommandLedger
from art_core.utils.output_dirs import get_default_art_path

__all__ = ["TrainingClient", "TrainingOperation"]

ResultT = TypeVar("ResultT", bound=Contract)


class TrainingOperation(Generic[ResultT]):
    """One admitted operation: its reference now, its result when it is done."""

    def __init__(self, ref: OperationRef, task: asyncio.Task[ResultT]) -> None:
        self._ref = ref
        self._task = task

    @property
    def ref(self) -> OperationRef:
        """The operation's run, id, place and learner versions."""
        return self._ref

    async def result(self) -> ResultT:
        """Wait for the operation; its result, or the error that stopped it."""
        return await asyncio.shield(self._task)

    async def cancel(self) -> None:
        """Withdraw the operation if it has not been sent yet (an operation the server has
        started runs to its end)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class TrainingClient:
    """A registered model's training run, driven one Tinker-shaped operation at a time."""

    def __init__(self, model: Any, run: TinkerRun, *, inputs: LocalInputStore) -> None:
        self.model = model
        self.run_id = f"{model.project}/{model.name}"
        self._run = run
        self._ledger = RunCommandLedger(self.run_id, learner_version=int(model.step))
        self._inputs = inputs
        self._sent: asyncio.Future[None] | None = None  # the last admitted operation, sent
        self._gradients: list[str] = []  # forward-backwards admitted since the last step
        self._operations: dict[str, TrainingOperation[Any]] = {}

    @classmethod
    async def create(
        cls, model: Any, *, input_dir: str | os.PathLike[str] | None = None
    ) -> TrainingClient:
        """Open the training client of a registered `TrainableModel` (its Tinker training run
        on the model's art-server). `input_dir`: where input objects are stored (default
        `<art path>/training-inputs`)."""
        backend = model.backend  # ModelNotRegisteredError when it is not registered
        run = await open_tinker_run(backend, model)
        folder = input_dir or os.path.join(get_default_art_path(), "training-inputs")
        return cls(model, run, inputs=LocalInputStore(folder))

    @property
    def projected_learner_version(self) -> int:
        """The learner version once every admitted operation has run."""
        return self._ledger.learner_version

    # ---------------------------------------------------------------------------- operations

    async def forward(self, request: ForwardRequest) -> TrainingOperation[ForwardResult]:
        """Score a batch under the current weights (no gradient)."""
        return self._submit(
            request, "forward", lambda ref, sent: self._forward(request, ref, sent, False)
        )

    async def forward_backward(
        self, request: ForwardBackwardRequest
    ) -> TrainingOperation[ForwardBackwardResult]:
        """Score a batch and add its gradient, applied by the next `optim_step`."""
        operation = self._submit(
            request, "forward_backward", lambda ref, sent: self._forward(request, ref, sent, True)
        )
        if operation.ref.operation_id not in self._gradients:
            self._gradients.append(operation.ref.operation_id)
        return operation

    async def optim_step(self, request: OptimStepRequest) -> TrainingOperation[OptimStepResult]:
        """Apply the gradients of the forward-backwards admitted since the last step."""
        if not self._gradients and not self._replay(request):
            raise TrainingCommandError(
                f"optim_step {request.request_id!r}: no forward_backward was admitted since "
                "the last step, so there is no gradient to apply"
            )
        contributing = tuple(self._gradients)
        operation = self._submit(
            request,
            "optim_step",
            lambda ref, sent: self._optim_step(request, ref, sent, contributing),
        )
        if contributing and operation.ref.kind == "optim_step":
            self._gradients = [g for g in self._gradients if g not in contributing]
        return operation

    async def save_weights_for_sampler(
        self, request: SaveWeightsForSamplerRequest
    ) -> TrainingOperation[SamplerWeightsResult]:
        """Save the adapter for sampling; published, it is the model's next served step."""
        return self._submit(
            request, "save_sampler", lambda ref, sent: self._save_sampler(request, ref, sent)
        )

    async def save_state(self, request: SaveStateRequest) -> TrainingOperation[SaveStateResult]:
        """Save weights and optimizer state under `checkpoint_name`."""
        return self._submit(
            request, "save_state", lambda ref, sent: self._save_state(request, ref, sent)
        )

    async def load_state(self, request: LoadStateRequest) -> TrainingOperation[LoadStateResult]:
        """Load saved weights (and the optimizer's state with `restore_optimizer`)."""
        return self._submit(
            request, "load_state", lambda ref, sent: self._load_state(request, ref, sent)
        )

    async def load_state_with_optimizer(
        self, request: LoadStateRequest
    ) -> TrainingOperation[LoadStateResult]:
        """Load saved weights and the optimizer's state."""
        request = request.model_copy(update={"restore_optimizer": True})
        return await self.load_state(request)

    async def put_input(
        self, batch: RlTrajectoryBatch | SupervisedTrajectoryBatch, *, normalize: bool = True
    ) -> TrainingInputObjectRef:
        """Resolve a batch to its token rows now and store them as an immutable input object;
        a request that names the reference trains exactly these rows, however often."""
        rows, _ = await self._rows(batch, normalize)
        return self._inputs.put(self.run_id, rows, batch.kind)

    async def close(self) -> None:
        """Wait for the admitted operations, then close the Tinker session."""
        await asyncio.gather(
            *(op._task for op in self._operations.values()), return_exceptions=True
        )
        self._run.close()

    # ------------------------------------------------------------------------------ ordering

    def _replay(self, request: RunCommand) -> bool:
        return request.request_id in self._operations

    def _submit(
        self,
        request: RunCommand,
        kind: OperationKind,
        work: Callable[[OperationRef, Callable[[], None]], Awaitable[Contract]],
    ) -> TrainingOperation[Any]:
        """Admit the command, then run `work` once the operation before it has been sent to the
        server; `work` calls its second argument right after sending its own."""
        admission = self._ledger.admit(request, kind)
        if admission.status == "replayed":
            return self._operations[request.request_id]
        previous = self._sent
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sent = sent

        def mark_sent() -> None:
            if not sent.done():
                sent.set_result(None)

        async def run() -> Contract:
            try:
                if previous is not None:
                    await asyncio.shield(previous)
                return await work(admission.ref, mark_sent)
            finally:
                mark_sent()  # failed or withdrawn before sending: the next one goes on

        operation: TrainingOperation[Any] = TrainingOperation(
            admission.ref, asyncio.create_task(run())
        )
        self._operations[request.request_id] = operation
        return operation

    # ----------------------------------------------------------------------------------- work

    async def _rows(
        self, batch: Any, normalize: bool
    ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        backend = self.model.backend
        if isinstance(batch, TrainingInputObjectRef):
            return await self._inputs.resolve(batch), {}
        if isinstance(batch, RlTrajectoryBatch):
            return await rl_rows(backend, batch.groups, normalize)
        return await sft_rows(backend, batch.trajectories, batch.assistant_turns == "last")

    async def _forward(
        self, request: ForwardRequest, ref: OperationRef, sent: Callable[[], None], backward: bool
    ) -> ForwardResult:
        rows, metrics = await self._rows(request.batch, request.loss.normalize_advantages)
        if not rows:
            raise TrainingCommandError(
                f"{ref.kind} {request.request_id!r}: the batch has no recorded turn to train "
                f"({metrics}); a group whose rewards are all equal, or turns the server holds "
                "no record of, teach nothing"
            )
        call = self._run.forward_backward if backward else self._run.forward
        future = call(rows, request.loss.name, dict(request.loss.values) or None)
        sent()
        output = await future
        outputs = tuple(
            LossFnOutput(token_logprobs=tuple(o["logprobs"].tolist()))
            for o in output.loss_fn_outputs
        )
        metrics.update({key: float(value) for key, value in (output.metrics or {}).items()})
        result_type = ForwardBackwardResult if backward else ForwardResult
        return result_type(
            operation_id=ref.operation_id,
            packing=packing_of(rows),
            loss_fn_outputs=outputs,
            metrics=metrics,
        )

    async def _optim_step(
        self,
        request: OptimStepRequest,
        ref: OperationRef,
        sent: Callable[[], None],
        contributing: tuple[str, ...],
    ) -> OptimStepResult:
        future = self._run.optim_step(request.optimizer)
        sent()
        response = await future
        version = ref.reserved_output_learner_version or ref.learner_parent_version
        return OptimStepResult(
            operation_id=ref.operation_id,
            contributing_forward_backward_operation_ids=contributing,
            checkpoint=CheckpointRef(
                run_id=self.run_id,
                learner_version=version,
                checkpoint_id=f"{self.run_id}@{version}",
            ),
            metrics={key: float(value) for key, value in (response.metrics or {}).items()},
        )

    async def _save_sampler(
        self, request: SaveWeightsForSamplerRequest, ref: OperationRef, sent: Callable[[], None]
    ) -> SamplerWeightsResult:
        future = self._run.save_weights_for_sampler(request.checkpoint_name, request.ttl_seconds)
        sent()
        saved = await future
        step = await self.model.get_step()
        served = (
            self.model.get_inference_name(step)
            if request.publication.mode == "versioned_lora"
            else None
        )
        return SamplerWeightsResult(
            operation_id=ref.operation_id,
            checkpoint=self._saved(ref, saved.path),
            lora=saved.path,
            served_model=served,
        )

    def _saved(self, ref: OperationRef, path: str) -> CheckpointRef:
        """What a save wrote: the learner version it saved, at `path`."""
        return CheckpointRef(
            run_id=self.run_id, learner_version=ref.learner_parent_version, checkpoint_id=path
        )

    async def _save_state(
        self, request: SaveStateRequest, ref: OperationRef, sent: Callable[[], None]
    ) -> SaveStateResult:
        future = self._run.save_state(
            request.checkpoint_name, request.ttl_seconds, request.overwrite
        )
        sent()
        saved = await future
        return SaveStateResult(
            operation_id=ref.operation_id,
            checkpoint=self._saved(ref, saved.path),
            optimizer_state=saved.path,
        )

    async def _load_state(
        self, request: LoadStateRequest, ref: OperationRef, sent: Callable[[], None]
    ) -> LoadStateResult:
        future = self._run.load_state(request.checkpoint, request.restore_optimizer)
        sent()
        await future
        version = ref.reserved_output_learner_version or ref.learner_parent_version + 1
        return LoadStateResult(
            operation_id=ref.operation_id,
            checkpoint=CheckpointRef(
                run_id=self.run_id, learner_version=version, checkpoint_id=request.checkpoint
            ),
            optimizer_restored=request.restore_optimizer,
        )
