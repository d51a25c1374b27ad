"""Peer side of the GRPO training benchmark: TRL's ``GRPOTrainer`` on CPU.

Written against trl 1.16.0 / transformers 5.23 / peft 0.21 (argument names checked in the installed
``trl/trainer/grpo_config.py`` and ``grpo_trainer.py``).

One optimizer step here = ``len(prompts)`` prompts x ``num_generations`` completions, generated and
trained in the same step: ``per_device_train_batch_size = generation_batch_size = prompts x
generations``, ``gradient_accumulation_steps = 1`` and ``steps_per_generation = 1``. With that
alignment (and ``num_iterations = 1``) TRL skips the extra no-grad "old log-probs" forward pass and
uses the detached current log-probs, so the clip ratio is exactly 1 and the step is: generate ->
reward -> one forward/backward over all completions -> AdamW step.

Timing: a ``TrainerCallback`` takes ``perf_counter`` stamps in ``on_step_begin`` / ``on_step_end``
(the full optimizer step, generation included, since TRL generates inside ``training_step``).
Inside that window, the trainer's ``_generate_and_score_completions`` (tokenize + ``generate()`` +
decode + reward + advantages) and ``_generate_single_turn`` (``generate()`` alone) are wrapped to
split rollout from training; "train" = step - rollout.

Run standalone::

    .venv/bin/python benchmarks/_trl_peer.py [--steps 4 --warmup 1] [--dtype float32|bfloat16|both]

Each configuration runs in its own subprocess so that the peak RSS is per run; the parent prints
one JSON dict on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_PROMPTS = [
    "What is 17 + 25? Answer with a number.",
    "How many legs do three spiders have in total?",
    "Name a prime number between 10 and 20.",
    "Count from one to five using digits.",
]


def _offline_env() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def digit_reward(completions: list[Any], **_: Any) -> list[float]:
    """1.0 if the completion contains a digit, else 0.0 (works for chat and plain completions)."""
    out = []
    for c in completions:
        text = c[-1]["content"] if isinstance(c, list) else str(c)
        out.append(1.0 if any(ch.isdigit() for ch in text) else 0.0)
    return out


class _RssSampler:
    """Samples this process's RSS every ``interval`` seconds; keeps the peak."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def one_step_per_batch(
    batch: int, num_generations: int, micro_batch: int | None = None
) -> dict[str, Any]:
    """GRPOConfig batch geometry: generate `batch` completions, train on them in one step (in
    forwards of `micro_batch` completions, their gradients accumulated, where given)."""
    micro = micro_batch or batch
    if batch % micro:
        raise ValueError(f"micro_batch {micro} does not divide the batch of {batch}")
    return {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": batch // micro,
        "generation_batch_size": batch,
        "num_generations": num_generations,
        "num_iterations": 1,
    }


def quiet_trainer_args(seed: int) -> dict[str, Any]:
    """GRPOConfig arguments shared by the TRL peers: no reporting, no saving, no workers."""
    return {
        "report_to": "none",
        "save_strategy": "no",
        "logging_strategy": "steps",
        "logging_steps": 1,
        "disable_tqdm": True,
        "log_completions": False,
        "seed": seed,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
    }


def lora_qkvo() -> Any:
    """The benchmarks' adapter: LoRA r16/alpha 32 on q, k, v, o, no dropout."""
    from peft import LoraConfig

    return LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_trl_train_steps(
    model_dir: str,
    *,
    prompts: list[str],
    num_generations: int = 4,
    max_new_tokens: int = 32,
    steps: int,
    warmup: int = 1,
    bf16_autocast: bool,
    gradient_checkpointing: bool = False,
    chat: bool = True,
    min_new_tokens: int | None = None,
    learning_rate: float = 1e-5,
    seed: int = 0,
    device: str = "cpu",
    micro_batch: int | None = None,
) -> dict:
    """Run ``warmup + steps`` GRPO optimizer steps with TRL and return medians over the last ``steps``.

    ``bf16_autocast``: ``GRPOConfig(bf16=True)`` -> accelerate CPU autocast to bfloat16 with fp32
    master weights (the base model is always loaded in float32). ``bf16=False`` is passed explicitly
    otherwise, because TRL's config defaults ``bf16`` to True when unset.
    ``chat``: wrap each prompt as a single user message so TRL applies the model's chat template.
    ``min_new_tokens``: optional ``generation_kwargs`` override to force full-length completions.
    ``device``: ``cpu`` (the default) or ``cuda`` (the GPU smoke benchmark: the model on the GPU,
    its peak GPU memory reported).
    ``micro_batch``: train the step's completions in forwards of this many, gradients
    accumulated (long prompts: 16 rows of 1,000 tokens in one forward took 24 GB).
    """
    _offline_env()
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if not prompts:
        raise ValueError("prompts must not be empty")
    rows = [{"prompt": [{"role": "user", "content": p}] if chat else p} for p in prompts]
    dataset = Dataset.from_list(rows)
    batch = len(prompts) * num_generations

    t_load = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(
        model_dir, padding_side="left", truncation_side="left"
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    load_s = time.perf_counter() - t_load

    out_dir = tempfile.mkdtemp(prefix="trl_peer_")
    args = GRPOConfig(
        output_dir=out_dir,
        use_cpu=device == "cpu",
        bf16=bf16_autocast,
        fp16=False,
        use_vllm=False,
        # batch geometry: one optimizer step = len(prompts) x num_generations completions
        **one_step_per_batch(batch, num_generations, micro_batch),
        max_completion_length=max_new_tokens,
        generation_kwargs=({"min_new_tokens": min_new_tokens} if min_new_tokens else None),
        # loss
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        learning_rate=learning_rate,
        max_steps=warmup + steps,
        gradient_checkpointing=gradient_checkpointing,
        **quiet_trainer_args(seed),
    )
    peft_config = lora_qkvo()

    steps_rec: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}

    class _StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            cur.clear()
            cur.update(
                rollout_s=0.0,
                generate_s=0.0,
                trained_tokens=0,
                prompt_tokens=0,
                padded_tokens=0,
                completions=0,
            )
            cur["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            cur["step_s"] = time.perf_counter() - cur.pop("t0")
            cur["train_s"] = cur["step_s"] - cur["rollout_s"]
            steps_rec.append(dict(cur))

        def on_log(self, args, state, control, logs=None, **kw):
            # transformers 5 logs *before* on_step_end, so the step's log belongs to `cur`
            if logs and "loss" in logs and "t0" in cur:
                cur["log"] = {k: v for k, v in logs.items() if isinstance(v, (int, float))}

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=digit_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_StepTimer()],
    )

    # -- instrumentation (instance-level wrappers; no TRL source is changed) --
    orig_gen_score = trainer._generate_and_score_completions
    orig_gen_single = trainer._generate_single_turn
    orig_compute_loss = trainer._compute_loss

    def gen_score(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig_gen_score(*a, **k)
        finally:
            cur["rollout_s"] = cur.get("rollout_s", 0.0) + time.perf_counter() - t

    def gen_single(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig_gen_single(*a, **k)
        finally:
            cur["generate_s"] = cur.get("generate_s", 0.0) + time.perf_counter() - t

    def compute_loss(model: Any, inputs: dict[str, Any]) -> Any:
        cm, pm = inputs["completion_mask"], inputs["prompt_mask"]
        cur["trained_tokens"] = cur.get("trained_tokens", 0) + int(cm.sum())
        cur["prompt_tokens"] = cur.get("prompt_tokens", 0) + int(pm.sum())
        cur["padded_tokens"] = cur.get("padded_tokens", 0) + int(cm.numel() + pm.numel())
        cur["completions"] = cur.get("completions", 0) + int(cm.shape[0])
        return orig_compute_loss(model, inputs)

    trainer._generate_and_score_completions = gen_score
    trainer._generate_single_turn = gen_single
    trainer._compute_loss = compute_loss

    # Which dtype actually runs in generate() vs the training forward (autocast is applied by
    # accelerate to the wrapped model's forward, which generate() may bypass).
    seen: dict[str, set[str]] = {"generate": set(), "train": set()}
    first_q = next(m for n, m in trainer.model.named_modules() if n.endswith("q_proj"))

    def _dtype_hook(mod: Any, inp: Any, out: Any) -> None:
        seen["train" if torch.is_grad_enabled() else "generate"].add(
            str(out.dtype).replace("torch.", "")
        )

    hook = first_q.register_forward_hook(_dtype_hook)

    import psutil

    me = psutil.Process()
    rss_after_load = me.memory_info().rss
    t_train = time.perf_counter()
    cpu_sys0, cpu_me0 = psutil.cpu_times(), me.cpu_times()
    with _RssSampler() as sampler, contextlib.redirect_stdout(sys.stderr):
        trainer.train()
    train_total_s = time.perf_counter() - t_train
    cpu_sys1, cpu_me1 = psutil.cpu_times(), me.cpu_times()
    own_cpu_s = (cpu_me1.user + cpu_me1.system) - (cpu_me0.user + cpu_me0.system)
    sys_cpu_s = sum(
        getattr(cpu_sys1, f, 0.0) - getattr(cpu_sys0, f, 0.0)
        for f in ("user", "nice", "system", "irq", "softirq", "steal")
    )
    other_load_cores = max(0.0, sys_cpu_s - own_cpu_s) / train_total_s
    hook.remove()

    measured = steps_rec[warmup:]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    result = {
        "peer": "trl.GRPOTrainer",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "model_dir": str(model_dir),
        "bf16_autocast": bf16_autocast,
        "gradient_checkpointing": gradient_checkpointing,
        "chat_template": chat,
        "prompts_per_step": len(prompts),
        "num_generations": num_generations,
        "completions_per_step": batch,
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": min_new_tokens,
        "trainable_params": trainable,
        "steps_measured": len(measured),
        "warmup_steps": warmup,
        "median_step_s": _median([s["step_s"] for s in measured]),
        "median_rollout_s": _median([s["rollout_s"] for s in measured]),
        "median_generate_s": _median([s["generate_s"] for s in measured]),
        "median_train_s": _median([s["train_s"] for s in measured]),
        "median_trained_tokens": _median([s["trained_tokens"] for s in measured]),
        "median_prompt_tokens": _median([s["prompt_tokens"] for s in measured]),
        "median_padded_tokens": _median([s["padded_tokens"] for s in measured]),
        "median_trained_tokens_per_s": _median(
            [s["trained_tokens"] / s["step_s"] for s in measured if s["step_s"] > 0]
        ),
        "observed_q_proj_dtype": {k: sorted(v) for k, v in seen.items()},
        "own_cpu_cores": own_cpu_s / train_total_s,
        # CPU used by *other* processes during train(): the machine is shared (os.cpu_count() cores)
        "other_load_cores": other_load_cores,
        "cpu_count": os.cpu_count(),
        "load_s": load_s,
        "train_total_s": train_total_s,
        "rss_after_load_mb": rss_after_load / 2**20,
        "peak_rss_sampled_mb": sampler.peak / 2**20,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "peak_gpu_memory_mib": (
            torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
        ),
        "steps": [
            {k: v for k, v in s.items() if k != "log"}
            | {
                "loss": s.get("log", {}).get("loss"),
                "reward": s.get("log", {}).get("reward"),
                "mean_length": s.get("log", {}).get("completions/mean_length"),
            }
            for s in steps_rec
        ],
    }
    return result


def run_trl_in_subprocess(model_dir: str, *, timeout: float | None = 1800, **kwargs: Any) -> dict:
    """Run :func:`run_trl_train_steps` in a fresh interpreter (so peak RSS is per run)."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps({"model_dir": str(model_dir), **kwargs}),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL peer failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _default_model_dir() -> str:
    from art_backend.testing import ensure_default_model

    return str(ensure_default_model())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--min-new-tokens", type=int, default=None)
    ap.add_argument("--no-chat", action="store_true")
    ns = ap.parse_args(argv)

    if ns.child:
        kw = json.loads(ns.child)
        res = run_trl_train_steps(kw.pop("model_dir"), **kw)
        sys.stdout.write(json.dumps(res) + "\n")
        return

    model_dir = ns.model_dir or _default_model_dir()
    dtypes = ["float32", "bfloat16"] if ns.dtype == "both" else [ns.dtype]
    out = {}
    for dt in dtypes:
        out[dt] = run_trl_in_subprocess(
            model_dir,
            prompts=DEFAULT_PROMPTS,
            steps=ns.steps,
            warmup=ns.warmup,
            bf16_autocast=(dt == "bfloat16"),
            gradient_checkpointing=ns.gradient_checkpointing,
            min_new_tokens=ns.min_new_tokens,
            chat=not ns.no_chat,
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
