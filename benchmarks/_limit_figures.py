"""The figures of `machine_limit.py`, each measured by one call (in a process of its own there).

- `matmul`: the practical peak, torch.mm of two square matrices, best of `repeats`;
- `decode`, contender `ours`: the torch engine's decode loop (`TorchEngine._admit`, then
  `_decode_step` and `_drop_finished` until every row has its tokens: the engine thread's loop
  body, run on this thread without the request queue), sampling at temperature 1, seeded rows;
- `decode`, contender `hf`: a bare transformers forward loop over a DynamicCache, greedy argmax,
  no sampling and no padding: what the model itself costs per token;
- `train`: the trainer's `forward_backward` on a GRPO step's rows (groups sharing their prompt,
  packed as the trainer packs them), LoRA r16 on q,k,v,o, then its `optim_step`.

Each returns tokens/s, the FLOPs the step executed (FlopCounterMode: every matmul, LoRA's and
the attention kernels' included, masked columns too; for decoding, counted on the first and the
last step, `_all_steps`) and the conventional count (2 x linear
parameters per decoded token, 6 x per trained token), and with `profile_steps` a profile
(`_op_profile`).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _op_profile import counting_flops, flops_by_kind, lora_modules, profiled, scope_modules, scoped

LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_figure(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure the figure `spec` describes (its `figure` key names it)."""
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    figures = {"matmul": matmul_peak, "decode": decode, "train": train, "floor": linear_floor}
    figure = figures[spec["figure"]]
    result = figure(spec)
    result["threads"] = torch.get_num_threads()
    return result


def matmul_peak(spec: dict[str, Any]) -> dict[str, Any]:
    """FLOP/s of torch.mm on two `size` x `size` matrices of `dtype`, best of `repeats`."""
    size, dtype = spec["size"], DTYPES[spec["dtype"]]
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(size, size, generator=generator).to(dtype)
    right = torch.randn(size, size, generator=generator).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    torch.mm(left, right, out=out)  # first-call costs (packing buffers) out of the figure
    times = []
    for _ in range(spec["repeats"]):
        started = time.perf_counter()
        torch.mm(left, right, out=out)
        times.append(time.perf_counter() - started)
    return {"flops_per_s": 2 * size**3 / min(times), "times_s": [round(t, 5) for t in times]}


def load_model(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The spec's model (eval mode, its dtype) and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = spec["model_dir"]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[spec["dtype"]]).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def linear_weights(model: Any) -> list[torch.Tensor]:
    """Every nn.Linear's weight in the model's order, a tied head's once."""
    weights: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            weights.setdefault(id(module.weight), module.weight.detach())
    return list(weights.values())


def linear_parameters(model: Any) -> int:
    """Weights that multiply a token's activations: every nn.Linear's, a tied head's once."""
    return sum(weight.numel() for weight in linear_weights(model))


def prompts(vocab_size: int, rows: int, length: int, seed: int = 0) -> list[list[int]]:
    """`rows` distinct prompts of `length` random token ids (special ids kept out)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (rows, length), generator=generator).tolist()


def linear_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds a decode step's linear layers take alone at `rows` rows: the model's own weights
    in its order, each read once a pass (streamed from memory, as a real step reads them), on
    random inputs, best of `repeats` passes after one warm-up. `kernel`: `dense` is
    `nn.functional.linear` (MKL's sgemm in float32, oneDNN on a plain weight in bf16), `packed`
    oneDNN on the weight packed once, as the engine runs it (`_packed_linear`).

    At a decode step's few rows a weight is used for few FLOPs, so this is far below the large-
    matrix peak: it is the floor a decode step cannot go under with these GEMM kernels."""
    model, _ = load_model(spec)
    weights = linear_weights(model)
    dtype = weights[0].dtype
    generator = torch.Generator().manual_seed(0)
    inputs = {
        width: torch.randn(spec["rows"], width, generator=generator).to(dtype)
        for width in {weight.shape[1] for weight in weights}
    }
    layers = [_floor_layer(weight, spec.get("kernel", "dense")) for weight in weights]
    times = []
    with torch.inference_mode():
        for repeat in range(spec["repeats"] + 1):
            started = time.perf_counter()
            for weight, layer in zip(weights, layers, strict=True):
                layer(inputs[weight.shape[1]])
            if repeat:  # the first pass is the warm-up
                times.append(time.perf_counter() - started)
    step = min(times)
    parameters = sum(weight.numel() for weight in weights)
    return {
        "step_s": step,
        "step_s_runs": [round(t, 5) for t in times],
        "flops_per_s": 2 * spec["rows"] * parameters / step,
        "weight_bytes_per_s": parameters * weights[0].element_size() / step,
    }


def _floor_layer(weight: torch.Tensor, kernel: str) -> Any:
    """The linear map of `weight` on the floor's `kernel` (see `linear_floor`)."""
    if kernel == "dense":
        return lambda x: torch.nn.functional.linear(x, weight)
    from art_backend.engines._packed_linear import pack_weight, packed_linear

    packed = pack_weight(weight)
    if packed is None:
        raise RuntimeError("this torch has no oneDNN packed linear")
    return lambda x: packed_linear(x, packed, None, weight)


def decode(spec: dict[str, Any]) -> dict[str, Any]:
    """Decode tokens/s and FLOP/s of one contender, best of `repeats` after a counted warm-up."""
    model, tokenizer = load_model(spec)
    linear = linear_parameters(model)
    batch = prompts(model.config.vocab_size, spec["rows"], spec["prompt_tokens"])
    run = _OurDecode(model, tokenizer, spec) if spec["contender"] == "ours" else _HFDecode(model)
    with torch.inference_mode():
        counted = run(batch, spec["new_tokens"], count_flops=True)  # also the warm-up
        runs = [run(batch, spec["new_tokens"]) for _ in range(spec["repeats"])]
        profile = run.profile(batch, spec) if spec.get("profile_steps") else None
    best = min(runs, key=lambda r: r["decode_s"])
    tokens = best["decode_tokens"]
    result = {
        "decode_tokens_per_s": tokens / best["decode_s"],
        "decode_s_runs": [round(r["decode_s"], 4) for r in runs],
        "prefill_s": round(best["prefill_s"], 4),
        "linear_parameters": linear,
        "conventional_flops_per_s": 2 * linear * tokens / best["decode_s"],
        "counted_flops_per_token": counted["flops"]["total"] / tokens,
        "counted_attention_flops_per_token": counted["flops"]["attention"] / tokens,
        "counted_flops_per_s": counted["flops"]["total"] / best["decode_s"],
        **{k: v for k, v in best.items() if k.startswith("split_")},
    }
    if profile is not None:
        result["profile"] = profile
    return result


class _OurDecode:
    """The torch engine's decode loop, driven on this thread (module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, spec: dict[str, Any]) -> None:
        from art_backend.engines._loading import prepare_to_serve
        from art_backend.testing import TorchEngine

        prepare_to_serve(model)  # as served: float32 logits, bf16's float64 attention, packing
        self.adapter = None
        # The adapter's folder lives only until the engine has loaded it (nothing left in TMPDIR).
        with tempfile.TemporaryDirectory(prefix="limit-lora-") as folder:
            lora_folder = Path(folder)
            if spec.get("adapter"):
                targets = spec.get("lora_targets", LORA["target_modules"])
                model = _with_lora_folder(model, lora_folder, targets)
            self.engine = TorchEngine(
                model,
                tokenizer,
                eos_token_ids=[],
                context_length=4096,
                max_batch_size=spec["rows"],
            )
            if spec.get("adapter"):
                self.engine.load_adapter("bench@1", lora_folder)
                self.adapter = "bench@1"
        torch.set_grad_enabled(False)

    def _admit(self, batch: list[list[int]], new_tokens: int) -> None:
        from art_backend.engines._engine import GenerationRequest, SamplingParams

        requests = []
        for row, ids in enumerate(batch):
            params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=row)
            request = GenerationRequest(
                prompt_ids=ids, params=params, adapter=self.adapter, stream_tokens=False
            )
            request._emit = lambda event: None
            requests.append(request)
        self.engine._admit(requests)

    def _step(self) -> None:
        self.engine._decode_step()
        self.engine._drop_finished()

    def __call__(
        self, batch: list[list[int]], new_tokens: int, count_flops: bool = False
    ) -> dict[str, Any]:
        engine = self.engine
        metrics = engine.metrics
        split_before = _split(metrics)
        started = time.perf_counter()
        self._admit(batch, new_tokens)
        admitted = time.perf_counter()
        steps = rows = 0
        counted: list[dict[str, int]] = []
        while engine._batch:
            rows += len(engine._batch)
            if count_flops and (steps == 0 or steps == new_tokens - 2):  # the first, the last
                with counting_flops() as counter:
                    self._step()
                counted.append(flops_by_kind(counter))
            else:
                self._step()
            steps += 1
        finished = time.perf_counter()
        split = {k: v - split_before[k] for k, v in _split(metrics).items()}
        return {
            "prefill_s": admitted - started,
            "decode_s": finished - admitted,
            "decode_tokens": rows,
            "flops": _all_steps(counted, steps),
            **{f"split_{k}_share": round(v / (finished - admitted), 4) for k, v in split.items()},
        }

    def profile(self, batch: list[list[int]], spec: dict[str, Any]) -> dict[str, Any]:
        """Profile `profile_steps` decode steps from the middle of a run."""
        engine = self.engine
        engine._draw = scoped(engine._draw, "sampling")  # type: ignore[method-assign]
        engine._record_rows = scoped(engine._record_rows, "rows")  # type: ignore[method-assign]
        scope_modules(lora_modules(engine.model), "lora")
        steps = spec["profile_steps"]
        self._admit(batch, spec["new_tokens"])
        for _ in range(max(spec["new_tokens"] // 2 - steps, 0)):
            self._step()
        with profiled(steps) as report:
            for _ in range(steps):
                self._step()
        while engine._batch:
            self._step()
        return report


def _all_steps(counted: list[dict[str, int]], steps: int) -> dict[str, int]:
    """The FLOPs of `steps` decode steps from those of the first and the last: every step runs
    the same rows over one more cache column than the one before, so its count is affine in
    the step and the mean of the two ends is the mean of all (counting every step under
    FlopCounterMode took minutes)."""
    if not counted:
        return {"total": 0, "attention": 0}
    first, last = counted[0], counted[-1]
    return {kind: (first[kind] + last[kind]) * steps // 2 for kind in first}


def _split(metrics: Any) -> dict[str, float]:
    """The engine's own split of its decode steps' time (seconds so far)."""
    return {
        "forward": metrics.decode_forward_seconds_total,
        "sampling": metrics.decode_sampling_seconds_total,
        "rows": metrics.decode_rows_seconds_total,
    }


def _with_lora_folder(model: Any, folder: Path, targets: list[str]) -> Any:
    """Save a LoRA adapter (LORA's rank and alpha on `targets`, random B so that it changes the
    logits) for `model` into `folder`; return the model unwrapped again."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        target_modules=targets,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    wrapped = get_peft_model(model, config)
    wrapped.save_pretrained(str(folder))
    return wrapped.unload()


class _HFDecode:
    """A bare forward loop over transformers' DynamicCache: no engine, no sampling."""

    def __init__(self, model: Any) -> None:
        from art_backend.engines._kv_cache import cache_keyword

        self.model = model
        self.keyword = cache_keyword(model)

    def __call__(
        self, batch: list[list[int]], new_tokens: int, count_flops: bool = False
    ) -> dict[str, Any]:
        from transformers import DynamicCache

        cache = DynamicCache()
        ids = torch.tensor(batch)
        started = time.perf_counter()
        logits = self._forward(ids, cache)
        admitted = time.perf_counter()
        counted: list[dict[str, int]] = []
        steps = new_tokens - 1  # as the engine: the prefill drew the first token
        for step in range(steps):
            next_ids = logits.argmax(-1, keepdim=True)
            if count_flops and step in (0, steps - 1):
                with counting_flops() as counter:
                    logits = self._forward(next_ids, cache)
                counted.append(flops_by_kind(counter))
            else:
                logits = self._forward(next_ids, cache)
        finished = time.perf_counter()
        return {
            "prefill_s": admitted - started,
            "decode_s": finished - admitted,
            "decode_tokens": len(batch) * steps,
            "flops": _all_steps(counted, steps),
        }

    def _forward(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        output = self.model(
            input_ids=ids, use_cache=True, logits_to_keep=1, **{self.keyword: cache}
        )
        return output.logits[:, -1, :]

    def profile(self, batch: list[list[int]], spec: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("the profile is of our engine's decode step")


# ---------------------------------------------------------------------------------- training


def grpo_rows(vocab_size: int, spec: dict[str, Any]) -> Any:
    """A GRPO step's rows: `groups` prompts x `per_group` completions, the prompt shared by its
    group, every completion token trained, advantages +-1 within a group."""
    from art_backend.testing import Sequence, pack_rows

    prompt_length, completion_length = spec["prompt_tokens"], spec["completion_tokens"]
    generator = torch.Generator().manual_seed(0)
    sequences = []
    for group in range(spec["groups"]):
        prompt = torch.randint(3, vocab_size, (prompt_length,), generator=generator)
        for member in range(spec["per_group"]):
            completion = torch.randint(3, vocab_size, (completion_length,), generator=generator)
            trained = torch.cat(
                [torch.zeros(prompt_length, dtype=torch.bool), torch.ones_like(completion).bool()]
            )
            sequences.append(
                Sequence(
                    input_ids=torch.cat([prompt, completion]),
                    trained_mask=trained,
                    # about a uniform draw's logprob: ratios near 1, as in a real step
                    old_logprobs=torch.where(trained, -math.log(vocab_size), 0.0),
                    advantage=1.0 if member % 2 else -1.0,
                    trajectory_id=f"{group}-{member}",
                    group_id=group,
                    truncated=False,
                )
            )
    rows, _ = pack_rows(
        sequences, max_length=prompt_length + completion_length, mask_truncated=False
    )
    return rows


def grpo_trainer(model: Any, tokenizer: Any, spec: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """A LoRA trainer (`LORA`) on `model`, prepared as served, with a GRPO step's rows
    (`grpo_rows` of `spec`), its loss and optimizer settings: (trainer, rows, loss, settings)."""
    from art_backend.engines._loading import prepare_to_serve
    from art_backend.testing import LoraTrainer, OptimizerSettings, TorchEngine, loss_preset
    from art_backend.training._grpo import loss_denominator
    from art_backend.training._losses import GRPOLoss

    prepare_to_serve(model)  # as served: float32 logits, bf16's float64 attention, packing
    engine = TorchEngine(model, tokenizer, eos_token_ids=[], context_length=4096)
    trainer = LoraTrainer(engine, "bench", LORA, seed=0)
    rows = grpo_rows(model.config.vocab_size, spec)
    config = loss_preset("grpo")
    loss = GRPOLoss(config, 0.0, loss_denominator(rows.trained_mask, config))
    return trainer, rows, loss, OptimizerSettings(learning_rate=1e-5)


def train(spec: dict[str, Any]) -> dict[str, Any]:
    """The trainer's forward+backward FLOP/s on a GRPO step's rows, best of `repeats` steps."""
    model, tokenizer = load_model(spec)
    linear = linear_parameters(model)
    trainer, rows, loss, settings = grpo_trainer(model, tokenizer, spec)
    lora_parameters = sum(p.numel() for p in trainer.params)

    with counting_flops() as counter:  # also the warm-up
        totals = trainer.forward_backward(rows, loss, settings)
    trainer.optim_step(settings)
    counted = flops_by_kind(counter)
    backward_s, optimizer_s = [], []
    for _ in range(spec["repeats"]):
        started = time.perf_counter()
        trainer.forward_backward(rows, loss, settings)
        stepped = time.perf_counter()
        trainer.optim_step(settings)
        backward_s.append(stepped - started)
        optimizer_s.append(time.perf_counter() - stepped)
    best = min(backward_s)
    processed = totals.processed_tokens
    result = {
        "rows": rows.num_rows,
        "row_tokens": int(rows.attention_mask.sum()),
        "processed_tokens": processed,
        "trained_tokens": totals.trained_tokens,
        "linear_parameters": linear,
        "lora_parameters": lora_parameters,
        "forward_backward_s_runs": [round(t, 4) for t in backward_s],
        "optim_step_s": round(min(optimizer_s), 4),
        "processed_tokens_per_s": processed / best,
        "conventional_flops_per_s": 6 * linear * processed / best,
        "counted_flops": counted["total"],
        "counted_attention_flops": counted["attention"],
        "counted_flops_per_s": counted["total"] / best,
    }
    if spec.get("profile_steps"):
        result["profile"] = _profile_training(trainer, rows, loss, settings, spec)
    return result


def _profile_training(
    trainer: Any, rows: Any, loss: Any, settings: Any, spec: dict[str, Any]
) -> dict[str, Any]:
    """Profile `profile_steps` whole training steps (forward+backward, then the optimizer)."""
    import art_backend.training._trainer as trainer_module

    for name in ("packed_logprobs_and_entropy", "token_logprobs_and_entropy"):
        setattr(trainer_module, name, scoped(getattr(trainer_module, name), "loss"))
    scored = _ScopedLoss(loss)
    trainer.optim_step = scoped(trainer.optim_step, "optimizer")
    with trainer.engine.exclusive() as model:
        scope_modules(lora_modules(model), "lora")
    with profiled(spec["profile_steps"]) as report:
        for _ in range(spec["profile_steps"]):
            trainer.forward_backward(rows, scored, settings)
            trainer.optim_step(settings)
    return report


class _ScopedLoss:
    """A BatchLoss whose calls run in the `bench:loss` profiler scope."""

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        self.needs_reference = loss.needs_reference
        self._call = scoped(loss.__call__, "loss")

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)
