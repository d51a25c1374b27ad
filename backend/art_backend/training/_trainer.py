"""The LoRA trainer of one model: the training core, Tinker's primitive, on the engine's model.

Two calls train: `forward_backward(rows, loss, settings)` scores rows (`_rows.Rows`, the one row
type) with a loss of the registry (`_losses`) and adds the gradient to the adapter's;
`optim_step(settings)` takes one AdamW step with what was added. Everything that trains
translates onto them: ART's `train()` (`grpo_step`), `train_sft` (`sft_step`), pipeline training
and replay (through `grpo_step`), and the Tinker API's forward_backward and optim_step
(`tinker._service`). One shared-prefix packer (`_packing`), one log-probability path
(`_logprobs`), one finiteness check before a gradient (`forward_backward`) and after
(`optim_step`).

The trainer does not own a copy of the model. Its adapter lives inside the engine's PEFT model
beside the served ones; each micro-batch takes the engine between two decode steps
(`Engine.exclusive`), so inference keeps serving while a step trains (it slows, nothing fails).
The served steps are separate adapters loaded from the checkpoints, so a request never sees
half-updated weights.

On several processes (`_distributed`), each rank's trainer trains its share of a step's rows
against the step's global loss denominator and sums the gradients with the other ranks' before
the optimizer step (`StepCollectives`); with one process nothing of that runs.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol

import torch

from art_backend._errors import CheckpointLoadError, TrainerStateError
from art_backend.engines._engine import TrainableEngine
from art_backend.training._grpo import LossConfig, loss_denominator
from art_backend.training._logprobs import packed_logprobs_and_entropy, token_logprobs_and_entropy
from art_backend.training._losses import BatchLoss, GRPOLoss, SFTLoss
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._packing import (
    PackedBatch,
    packed_attention_masks,
    packed_micro_batches,
    packing_supported,
)
from art_backend.training._rows import Rows, micro_batches
from art_backend.training._step_metrics import StepMetrics
from art_backend.training._trainer_state import (
    ADAPTER_WEIGHTS,
    TRAINER_STATE,
    read_trainer_state,
    short_error,
    state_message,
)


class StepCollectives(Protocol):
    """What a data-parallel step asks of the other ranks (`_distributed.DataParallel`)."""

    def shard(self, rows: Rows, *, keep_groups: bool = True) -> Rows:
        """This rank's share of the step's rows."""
        ...

    def all_reduce_gradients(self, params: list[torch.Tensor]) -> None:
        """Every param's grad becomes the sum of all ranks' grads."""
        ...

    def sum_numbers(self, numbers: list[float], device: torch.device) -> list[float]:
        """The sum over ranks of each number."""
        ...

    def check_same_parameters(self, params: list[torch.Tensor]) -> None:
        """Raise unless every rank holds the same adapter."""
        ...


class LoraTrainer:
    """GRPO and SFT on one LoRA adapter inside the engine's model, with AdamW."""

    def __init__(
        self,
        engine: TrainableEngine,
        adapter_name: str,
        lora: dict[str, Any],
        *,
        seed: int = 0,
        data_parallel: StepCollectives | None = None,
    ):
        from peft import LoraConfig

        self.engine = engine
        self.adapter_name = adapter_name
        self.lora = lora
        # Set when the step runs on several processes; every rank calls the same step methods.
        self.data_parallel = data_parallel
        config = LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora.get("dropout", 0.0),
            target_modules=list(lora["target_modules"]),
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng():  # the LoRA init is reproducible and leaves global RNG alone
            torch.manual_seed(seed)
            engine.add_trainable_adapter(adapter_name, config)
        with engine.exclusive() as model:
            self.params = [
                param
                for name, param in sorted(model.named_parameters())
                if f".{adapter_name}." in name
            ]
            self.packs_prefixes = packing_supported(model)
        if not self.params:
            raise ValueError(
                f"LoRA target modules {lora['target_modules']} matched nothing in the model"
            )
        for param in self.params:
            param.requires_grad_(True)
        # No scheduler: each step sets its own learning rate, from its TrainConfig.
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-5, betas=(0.9, 0.99), eps=1e-8)
        self.optimizer_steps = 0
        # What forward_backward added since the last optim_step: its sums, and on several
        # processes the failures that optim_step raises after joining the others.
        self._pending = StepMetrics()
        self._failure: list[BaseException] = []

    # ---------------------------------------------------------------- the primitive: two calls

    def forward_backward(
        self,
        rows: Rows,
        loss: BatchLoss,
        settings: OptimizerSettings,
        *,
        backward: bool = True,
        pack: bool = True,
        share_trained: bool = False,
    ) -> StepMetrics:
        """Score `rows` with `loss`, micro-batch by micro-batch, and (with `backward`) add the
        gradient of their summed loss to the adapter's, where it stays until `optim_step`.

        The rows of a group carry their shared prefix through the model once (`_packing`). A
        micro-batch whose loss is not finite raises FloatingPointError before its backward, and
        the gradient goes back to what it was before this call: a call adds all of its gradient
        or none of it. Returns the sums of the step so far (`optim_step` starts the next); a
        forward-only call returns its own.
        """
        # A forward-only call scores without joining the step: its sums are its own.
        totals = self._pending if backward else StepMetrics()
        undo = backward and self.data_parallel is None
        before = (copy.deepcopy(totals), self._gradients()) if undo else None
        batches = (
            packed_micro_batches(
                rows, token_budget=settings.micro_batch_tokens, share_trained=share_trained
            )
            if pack and self.packs_prefixes
            else micro_batches(rows, token_budget=settings.micro_batch_tokens)
        )
        try:
            with self._joining_the_other_ranks():
                for forward in batches:
                    self._forward_backward_one(forward, loss, settings, backward, totals)
        except BaseException:
            if before is not None:
                self._pending = before[0]
                self._restore_gradients(before[1])
            raise
        return totals

    def _forward_backward_one(
        self,
        forward: Rows | PackedBatch,
        loss: BatchLoss,
        settings: OptimizerSettings,
        backward: bool,
        totals: StepMetrics,
    ) -> None:
        """`forward_backward` of one micro-batch, its sums added to `totals`."""
        batch = forward.rows if isinstance(forward, PackedBatch) else forward
        with self.engine.exclusive() as model:
            reference = self._reference_logprobs(model, forward) if loss.needs_reference else None
            with self._scoring(model, settings, backward):
                new, entropy = self._logprobs(model, forward)
                value = loss(batch, new, reference, totals)
                if backward:
                    if not torch.isfinite(value):  # never let NaN or inf reach a gradient
                        raise FloatingPointError(
                            f"the loss is not finite ({float(value.detach())})"
                        )
                    value.backward()
        totals.loss += float(value.detach())
        totals.entropy_sum += float(entropy)
        totals.trained_tokens += int(batch.trained_mask.sum())
        real_tokens = int(batch.attention_mask.sum())
        if isinstance(forward, PackedBatch):
            totals.processed_tokens += forward.processed_tokens
            totals.shared_prefix_tokens += real_tokens - forward.processed_tokens
        else:
            totals.processed_tokens += real_tokens
        totals.micro_batches += 1

    def optim_step(self, settings: OptimizerSettings) -> float:
        """One AdamW step with the gradients `forward_backward` added since the last one;
        returns their norm. A gradient that is not finite is dropped (FloatingPointError) and
        the adapter stays as it was."""
        totals, self._pending = self._pending, StepMetrics()
        failure, self._failure = self._failure, []
        if self.data_parallel is not None:
            self._sum_over_ranks(totals, failure)
        # Identical on every rank: the same summed gradients, the same clip, the same AdamW.
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, settings.max_grad_norm))
        if not math.isfinite(grad_norm):  # never write NaN into the adapter
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm ({grad_norm}); step skipped")
        for group in self.optimizer.param_groups:
            group["lr"] = settings.learning_rate
            group["weight_decay"] = settings.weight_decay
            if settings.betas is not None:
                group["betas"] = settings.betas
            if settings.eps is not None:
                group["eps"] = settings.eps
        with self.engine.exclusive():
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        if self.data_parallel is not None:
            self.data_parallel.check_same_parameters(self.params)
        return grad_norm

    # ------------------------------------------------------------- steps: translations onto it

    def grpo_step(
        self, rows: Rows, loss_config: LossConfig, settings: OptimizerSettings, *, beta: float
    ) -> dict[str, float]:
        """One optimizer step of the policy loss over `rows` (ART's `train()`)."""
        started = time.perf_counter()
        # Over ALL the step's rows, before sharding: a per-rank denominator weighs each rank's
        # tokens differently from one process (1.9x off, measured; `_distributed`).
        denominator = loss_denominator(rows.trained_mask, loss_config)
        loss = GRPOLoss(loss_config, beta, denominator)
        totals = self.forward_backward(self._my_share(rows), loss, settings)
        grad_norm = self.optim_step(settings)
        return totals.as_dict(
            time.perf_counter() - started,
            grad_norm,
            with_kl=beta > 0,
            with_kl_penalty=loss_config.kl_penalty_coef > 0,
        )

    def sft_step(self, rows: Rows, settings: OptimizerSettings) -> dict[str, float]:
        """One optimizer step of cross-entropy on the trained (assistant) tokens of `rows`."""
        started = time.perf_counter()
        loss = SFTLoss(max(rows.trained_tokens, 1))  # all the step's rows, before sharding
        rows = self._my_share(rows, keep_groups=False)  # SFT rows have no groups
        totals = self.forward_backward(rows, loss, settings, pack=False)
        grad_norm = self.optim_step(settings)
        return totals.as_dict(time.perf_counter() - started, grad_norm, with_kl=False)

    # --------------------------------------------------------------------------- the gradients

    def _gradients(self) -> list[torch.Tensor | None]:
        """A copy of the adapter's gradients (None where there is none yet)."""
        return [None if p.grad is None else p.grad.detach().clone() for p in self.params]

    def _restore_gradients(self, saved: list[torch.Tensor | None]) -> None:
        for param, grad in zip(self.params, saved, strict=True):
            param.grad = grad

    @contextlib.contextmanager
    def _scoring(self, model: Any, settings: OptimizerSettings, backward: bool) -> Iterator[None]:
        """This adapter's forward, with gradients only when they are wanted."""
        if backward:
            with self._training(model, settings):
                yield
            return
        model.set_adapter(self.adapter_name)
        with torch.no_grad():
            yield

    # --------------------------------------------------------------------- several processes

    def _my_share(self, rows: Rows, *, keep_groups: bool = True) -> Rows:
        """This rank's rows of the step: all of them on one process."""
        if self.data_parallel is None:
            return rows
        return self.data_parallel.shard(rows, keep_groups=keep_groups)

    @contextlib.contextmanager
    def _joining_the_other_ranks(self) -> Iterator[None]:
        """On several processes, a rank whose forward or backward fails still joins the step's
        all-reduce (the others wait in it), then fails with the others (`optim_step`)."""
        if self.data_parallel is None:
            yield
            return
        try:
            yield
        except Exception as error:  # noqa: BLE001 (raised again after the all-reduce)
            self._failure.append(error)

    def _sum_over_ranks(self, totals: StepMetrics, failure: list[BaseException]) -> None:
        """Every rank's gradients and step sums become the sums over all ranks; raise if a rank
        failed. The same collectives in the same order on every rank, rows or none."""
        assert self.data_parallel is not None
        self.data_parallel.all_reduce_gradients(self.params)
        names = [f.name for f in fields(StepMetrics) if f.name != "extra"]
        sums = self.data_parallel.sum_numbers(
            [float(getattr(totals, name)) for name in names] + [float(bool(failure))],
            self.params[0].device,
        )
        for name, value in zip(names, sums[:-1], strict=True):
            setattr(totals, name, type(getattr(totals, name))(value))
        if failure or sums[-1]:
            self.optimizer.zero_grad(set_to_none=True)
            if failure:
                raise failure[0]
            raise RuntimeError(
                f"{int(sums[-1])} other training rank(s) failed this step (their log says why); "
                "nothing was trained."
            )

    # ---------------------------------------------------------------------------------- forward

    @contextlib.contextmanager
    def _training(self, model: Any, settings: OptimizerSettings) -> Iterator[None]:
        """Route the forward through this adapter; training mode only for gradient checkpointing."""
        model.set_adapter(self.adapter_name)  # also gives requires_grad to this adapter only
        if settings.gradient_checkpointing:
            _activation_checkpointing(model, enable=True)
            model.train()
        try:
            with torch.enable_grad():
                yield
        finally:
            if settings.gradient_checkpointing:
                _activation_checkpointing(model, enable=False)
            model.eval()  # the engine's mixed-adapter forward refuses training mode

    def _logprobs(self, model: Any, batch: Rows | PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """New logprobs aligned with input_ids (see `_rows`), and the summed entropy of trained tokens.

        Only the logits from the first trained position on are computed: the LM head is the
        largest matrix of a small model, and prompt positions need none.
        """
        if isinstance(batch, PackedBatch):
            return self._packed_logprobs(model, batch)
        first = _first_trained_column(batch)
        width = batch.input_ids.shape[1]
        device = self.engine.device
        output = model(
            input_ids=batch.input_ids.to(device),
            attention_mask=batch.attention_mask.to(device),
            use_cache=False,
            logits_to_keep=width - first + 1,
        )
        new, entropy = token_logprobs_and_entropy(
            output.logits.cpu(), batch.labels, first_column=first
        )
        entropy_sum = torch.where(batch.trained_mask, entropy, 0.0).sum()
        return new, entropy_sum

    def _packed_logprobs(
        self, model: Any, packed: PackedBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_logprobs` of a packed micro-batch: one forward with the shared-prefix mask."""
        device = self.engine.device
        width = packed.input_ids.shape[1]
        output = model(
            input_ids=packed.input_ids.to(device),
            attention_mask=packed_attention_masks(packed, model.config, model.dtype, device),
            position_ids=packed.position_ids.to(device),
            use_cache=False,
            logits_to_keep=width - packed.first_kept,
        )
        new, entropy = packed_logprobs_and_entropy(output.logits, packed)
        return new.cpu(), entropy.sum().cpu()

    @torch.no_grad()
    def _reference_logprobs(self, model: Any, batch: Rows | PackedBatch) -> torch.Tensor:
        with model.disable_adapter():
            reference, _ = self._logprobs(model, batch)
        return reference

    # ------------------------------------------------------------------------------------ state

    def save(self, folder: Path) -> None:
        """Write the adapter (PEFT format, servable) and the optimizer and RNG state."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        with self.engine.exclusive() as model:
            weights = get_peft_model_state_dict(model, adapter_name=self.adapter_name)
            weights = {key: tensor.detach().cpu().contiguous() for key, tensor in weights.items()}
            config = model.peft_config[self.adapter_name]
        save_file(weights, folder / ADAPTER_WEIGHTS)
        config.save_pretrained(str(folder))
        # Tensors, numbers and plain containers only: loadable with `weights_only=True`.
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "optimizer_steps": self.optimizer_steps,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            },
            folder / TRAINER_STATE,
        )

    def load(self, folder: Path) -> None:
        """Restore adapter weights and, when present, the optimizer and RNG state.

        Nothing is unpickled: the weights are safetensors and the state loads with
        `weights_only=True`; a state file that holds anything else raises TrainerStateError.
        """
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        try:
            weights = load_file(str(folder / ADAPTER_WEIGHTS))
            with self.engine.exclusive() as model:
                result = set_peft_model_state_dict(model, weights, adapter_name=self.adapter_name)
        except Exception as error:  # a size mismatch (another base model), a torn file
            raise CheckpointLoadError(
                f"The adapter weights of checkpoint {folder} do not load onto this base model "
                f"({short_error(error)}). Was it trained on another base model? "
                "Serve that base model, or register under another name."
            ) from error
        missing = [
            key for key in getattr(result, "missing_keys", []) if f".{self.adapter_name}." in key
        ]
        if missing:
            raise CheckpointLoadError(
                f"Checkpoint {folder} lacks adapter weights {missing[:3]}: its LoRA settings "
                "differ from the model's saved ones (model.json)."
            )
        state_path = folder / TRAINER_STATE
        if not state_path.is_file():
            return
        state = read_trainer_state(state_path)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            random.setstate(state["rng"]["python"])
            torch.set_rng_state(state["rng"]["torch"])
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise TrainerStateError(state_message(state_path, error)) from error
        self.optimizer_steps = state["optimizer_steps"]

    def close(self) -> None:
        """Remove this trainer's adapter from the engine's model."""
        self.engine.remove_trainable_adapter(self.adapter_name)


def _first_trained_column(batch: Rows) -> int:
    trained_columns = batch.trained_mask.any(0).nonzero()
    # Position 0 is never trained (every turn has a prompt), so first >= 1.
    return max(int(trained_columns[0]) if trained_columns.numel() else 1, 1)


def _activation_checkpointing(model: Any, *, enable: bool) -> None:
    """Recompute activations in the backward instead of keeping them (or stop doing so).

    transformers 5.24 renamed `gradient_checkpointing_*` to `activation_checkpointing_*` (the old
    names warn on every call until v6); earlier 5.x releases have only the old names.
    """
    if hasattr(model, "activation_checkpointing_enable"):
        if enable:
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            model.activation_checkpointing_disable()
    elif enable:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
