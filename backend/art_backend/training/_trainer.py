"""The LoRA trainer of one model: GRPO and SFT steps on the engine's model, and its state on disk.

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
import math
import pickle
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import torch

from art_backend._errors import CheckpointLoadError, TrainerStateError
from art_backend.engines._engine import TrainableEngine
from art_backend.training._grpo import LossConfig, loss_denominator, policy_loss
from art_backend.training._optimizer import OptimizerSettings
from art_backend.training._packing import (
    PackedBatch,
    packed_attention_masks,
    packed_logprobs_and_entropy,
    packed_micro_batches,
    packing_supported,
)
from art_backend.training._rows import Rows, micro_batches, token_logprobs_and_entropy
from art_backend.training._target_rows import (
    TargetBatch,
    TargetPack,
    TargetRow,
    packed_target_logprobs,
    target_batches,
    target_logprobs,
)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
# A row's elementwise loss from its target logprobs (`score_targets`): (row index, logprobs).
RowLoss = Callable[[int, torch.Tensor], torch.Tensor]
TRAINER_STATE = "trainer_state.pt"


@dataclass
class StepMetrics:
    """Sums over the micro-batches of one step, turned into the step's metrics by `as_dict`."""

    loss: float = 0.0
    entropy_sum: float = 0.0
    kl_sum: float = 0.0
    kl_policy_ref_sum: float = 0.0
    clipped_sum: float = 0.0
    ratio_sum: float = 0.0
    logprob_diff_sum: float = 0.0
    trained_tokens: int = 0
    processed_tokens: int = 0
    shared_prefix_tokens: int = 0  # prompt tokens a packed forward did not run again
    micro_batches: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(
        self, seconds: float, grad_norm: float, with_kl: bool, with_kl_penalty: bool = False
    ) -> dict[str, float]:
        tokens = max(self.trained_tokens, 1)
        metrics = {
            "loss": self.loss,
            "entropy": self.entropy_sum / tokens,
            "grad_norm": grad_norm,
            "trained_tokens": float(self.trained_tokens),
            "micro_batches": float(self.micro_batches),
            "trainer_seconds": seconds,
            "trainer_tokens_per_second": self.processed_tokens / seconds if seconds else 0.0,
            "shared_prefix_tokens": float(self.shared_prefix_tokens),
            **self.extra,
        }
        if self.ratio_sum:
            metrics["clip_fraction"] = self.clipped_sum / tokens
            metrics["ratio_mean"] = self.ratio_sum / tokens
            metrics["logprob_abs_diff"] = self.logprob_diff_sum / tokens
        if with_kl:
            metrics["kl"] = self.kl_sum / tokens
        if with_kl_penalty:  # ART's name: mean logp_source - logp_ref over trained tokens
            metrics["kl_policy_ref"] = self.kl_policy_ref_sum / tokens
        return metrics


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

    # ------------------------------------------------------------------------------------ steps

    def grpo_step(
        self, rows: Rows, loss_config: LossConfig, settings: OptimizerSettings, *, beta: float
    ) -> dict[str, float]:
        """One optimizer step of the policy loss over `rows` (micro-batched, accumulated)."""
        started = time.perf_counter()
        totals = StepMetrics()
        # Over ALL the step's rows, before sharding: a per-rank denominator weighs each rank's
        # tokens differently from one process (1.9x off, measured; `_distributed`).
        denominator = loss_denominator(rows.trained_mask, loss_config)
        rows = self._my_share(rows)
        # The reference (the base model: adapter disabled) for beta's KL and ART's KL penalty.
        with_reference = beta > 0 or loss_config.kl_penalty_coef > 0
        # The samples of a group share their prompt: it goes through the model once (`_packing`).
        batches = (
            packed_micro_batches(rows, token_budget=settings.micro_batch_tokens)
            if self.packs_prefixes
            else micro_batches(rows, token_budget=settings.micro_batch_tokens)
        )
        with self._joining_the_other_ranks() as failure:
            for forward in batches:
                batch = forward.rows if isinstance(forward, PackedBatch) else forward
                with self.engine.exclusive() as model:
                    ref = self._reference_logprobs(model, forward) if with_reference else None
                    with self._training(model, settings):
                        new, entropy = self._logprobs(model, forward)
                        loss, parts = policy_loss(
                            new,
                            batch.old_logprobs,
                            batch.advantages,
                            batch.trained_mask,
                            loss_config,
                            ref_logprobs=ref,
                            beta=beta,
                            denominator=denominator,
                        )
                        loss.backward()
                tokens = int(batch.trained_mask.sum())
                totals.loss += float(loss.detach())
                totals.entropy_sum += float(entropy)
                totals.clipped_sum += float(parts["clip_fraction"]) * tokens
                totals.ratio_sum += float(parts["ratio_mean"]) * tokens
                totals.logprob_diff_sum += float(parts["logprob_abs_diff"]) * tokens
                totals.kl_sum += float(parts.get("kl", 0.0)) * tokens
                totals.kl_policy_ref_sum += float(parts.get("kl_policy_ref", 0.0)) * tokens
                totals.trained_tokens += tokens
                real_tokens = int(batch.attention_mask.sum())
                if isinstance(forward, PackedBatch):
                    totals.processed_tokens += forward.processed_tokens
                    totals.shared_prefix_tokens += real_tokens - forward.processed_tokens
                else:
                    totals.processed_tokens += real_tokens
                totals.micro_batches += 1
        grad_norm = self._optimizer_step(settings, totals, failure)
        return totals.as_dict(
            time.perf_counter() - started,
            grad_norm,
            with_kl=beta > 0,
            with_kl_penalty=loss_config.kl_penalty_coef > 0,
        )

    def sft_step(self, rows: Rows, settings: OptimizerSettings) -> dict[str, float]:
        """One optimizer step of cross-entropy on the trained (assistant) tokens of `rows`."""
        started = time.perf_counter()
        totals = StepMetrics()
        denominator = max(rows.trained_tokens, 1)  # all the step's rows, before sharding
        rows = self._my_share(rows, keep_groups=False)  # SFT rows have no groups
        with self._joining_the_other_ranks() as failure:
            for batch in micro_batches(rows, token_budget=settings.micro_batch_tokens):
                with self.engine.exclusive() as model, self._training(model, settings):
                    new, entropy = self._logprobs(model, batch)
                    loss = -torch.where(batch.trained_mask, new, 0.0).sum() / denominator
                    loss.backward()
                totals.loss += float(loss.detach())
                totals.entropy_sum += float(entropy)
                totals.trained_tokens += int(batch.trained_mask.sum())
                totals.processed_tokens += int(batch.attention_mask.sum())
                totals.micro_batches += 1
        grad_norm = self._optimizer_step(settings, totals, failure)
        return totals.as_dict(time.perf_counter() - started, grad_norm, with_kl=False)

    def score_targets(
        self, rows: list[TargetRow], loss: RowLoss, *, backward: bool, token_budget: int = 2048
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each row's target logprobs and elementwise loss (`_target_rows`; `loss(index,
        logprobs)` gives row `index`'s). With `backward`, the gradient of the summed loss is
        added to the adapter's, and stays there until `apply_gradients` (the Tinker API's
        forward_backward, then optim_step)."""
        logprobs = [torch.empty(0)] * len(rows)
        losses = [torch.empty(0)] * len(rows)
        # Datums that begin alike (a group's samples of one prompt) share their prefix's forward.
        batches = target_batches(rows, token_budget=token_budget, pack=self.packs_prefixes)
        for batch in batches:
            with self.engine.exclusive() as model, self._scoring(model, backward):
                scored = self._target_logprobs(model, batch)
                total = scored.new_zeros(())
                for line, (index, length) in enumerate(
                    zip(batch.indices, batch.lengths, strict=True)
                ):
                    values = loss(index, scored[line, :length])
                    logprobs[index] = scored[line, :length].detach().cpu()
                    losses[index] = values.detach().cpu()
                    total = total + values.sum()
                if backward:
                    total.backward()
        return logprobs, losses

    def apply_gradients(self, settings: OptimizerSettings) -> float:
        """One AdamW step with the gradients `score_targets` accumulated; returns their norm."""
        if self.data_parallel is not None:
            raise RuntimeError("apply_gradients runs on one process only")
        return self._optimizer_step(settings, StepMetrics(), [])

    @contextlib.contextmanager
    def _scoring(self, model: Any, backward: bool) -> Iterator[None]:
        """This adapter's forward, with gradients only when they are wanted."""
        if backward:
            with self._training(model, OptimizerSettings()):
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
    def _joining_the_other_ranks(self) -> Iterator[list[BaseException]]:
        """On several processes, a rank whose forward or backward fails still joins the step's
        all-reduce (the others wait in it), then fails with the others (`_optimizer_step`)."""
        failure: list[BaseException] = []
        if self.data_parallel is None:
            yield failure
            return
        try:
            yield failure
        except Exception as error:  # noqa: BLE001 (raised again after the all-reduce)
            failure.append(error)

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

    def _optimizer_step(
        self, settings: OptimizerSettings, totals: StepMetrics, failure: list[BaseException]
    ) -> float:
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
            output.logits.cpu(), batch.input_ids, first_column=first
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

    def _target_logprobs(self, model: Any, batch: TargetBatch | TargetPack) -> torch.Tensor:
        """Each row's target logprobs, [rows, longest] (`_target_rows`)."""
        device = self.engine.device
        if isinstance(batch, TargetBatch):
            output = model(
                input_ids=batch.input_ids.to(device),
                attention_mask=batch.attention_mask.to(device),
                use_cache=False,
            )
            return target_logprobs(output.logits, batch.target_ids.to(device))
        output = model(
            input_ids=batch.input_ids.to(device),
            attention_mask=packed_attention_masks(batch, model.config, model.dtype, device),
            position_ids=batch.position_ids.to(device),
            use_cache=False,
        )
        return packed_target_logprobs(output.logits, batch)

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
                f"({_short(error)}). Was it trained on another base model? "
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
            raise TrainerStateError(_state_message(state_path, error)) from error
        self.optimizer_steps = state["optimizer_steps"]

    def close(self) -> None:
        """Remove this trainer's adapter from the engine's model."""
        self.engine.remove_trainable_adapter(self.adapter_name)


def read_trainer_state(path: Path) -> dict[str, Any]:
    """The optimizer and RNG state of `path`, loaded without running any pickled code.

    A state written before the constant learning-rate scheduler went (it never changed a rate:
    each step sets its own) also holds a "scheduler" entry; it is read and ignored."""
    try:
        # weights_only: tensors, numbers and plain containers; any other object is refused
        # before it is built, so a planted pickle never runs.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message advises `weights_only=False`, the very hole closed here: keep only
        # the line that says what was refused (e.g. "unsupported GLOBAL posix.system").
        lines = [line for line in str(error).splitlines() if line.strip()]
        refused = [line for line in lines if "weights_only" not in line.lower()]
        reason = pickle.UnpicklingError(" ".join(refused) or "a non-tensor object")
        raise TrainerStateError(_state_message(path, reason)) from None
    except Exception as error:  # a torn zip, a truncated file: the file is unusable
        raise TrainerStateError(_state_message(path, error)) from error
    shape_ok = (
        isinstance(state, dict)
        and isinstance(state.get("optimizer"), dict)
        and isinstance(state.get("scheduler", {}), dict)
        and isinstance(state.get("optimizer_steps"), int)
        and isinstance(state.get("rng"), dict)
        and isinstance(state["rng"].get("torch"), torch.Tensor)
        and isinstance(state["rng"].get("python"), tuple)
    )
    if not shape_ok:
        raise TrainerStateError(_state_message(path, ValueError("unexpected contents")))
    return state


def _short(error: Exception, limit: int = 300) -> str:
    """`Type: message` on one line, cut to `limit` characters."""
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _state_message(path: Path, error: Exception) -> str:
    return (
        f"The trainer state {path} cannot be used ({_short(error)}): it holds something other than plain tensors and numbers (written by another "
        "program, or tampered with), or is damaged. The adapter weights beside it are fine: "
        "delete the file to resume from them with a fresh optimizer."
    )


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
