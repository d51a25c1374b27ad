"""Peer side of the learning-curve benchmark: TRL's ``GRPOTrainer`` on the demo task, on CPU.

Written against trl 1.16.0 / transformers 5.23 / peft 0.21. Settings follow ``_trl_peer.py`` (read
there for the batch geometry) and our trainer's defaults:

* one optimizer step = ``groups_per_step`` questions x ``rollouts_per_group`` samples, generated
  and trained in the same step (``per_device_train_batch_size = generation_batch_size = groups x
  rollouts``, ``gradient_accumulation_steps = 1``, ``steps_per_generation = 1``, ``num_iterations =
  1``); temperature 1.0, top_p 1.0, top_k 0 (off), 16 new tokens;
* LoRA r16 / alpha 32 / dropout 0 on q,k,v,o; float32 model, ``bf16=False`` and
  ``gradient_checkpointing=False`` (GRPOConfig defaults both on; ours has neither);
* ``loss_type="dapo"``, eps 0.2 / 0.28, ``scale_rewards="group"``, ``beta=0``;
* AdamW (betas 0.9 / 0.99, eps 1e-8, weight decay 0 — our trainer's optimizer), a *constant*
  learning rate (TRL's default scheduler is linear decay to 0; ours is constant), grad clip 1.0.

Data order: the train questions are laid out in exactly the order our demo loop sees them —
``art_core.iterate_dataset(train_questions, groups_per_step, num_epochs=100, use_tqdm=False)`` (its
default shuffle seed, as ``benchmarks/learning_curve.py`` calls it), first ``steps`` batches
concatenated — and TRL's shuffling is off (``shuffle_dataset=False``), so ``RepeatSampler`` walks
the rows in order, ``groups_per_step`` rows per step. The reward function records the questions
it scores; the result says whether each step saw exactly our batch (``data_order_matched``).

Held-out evaluation (step 0, every ``eval_every`` steps, and the last step): greedy, batched
``generate`` of the trainer's model with the adapter active, left padding, chat template with
``add_generation_prompt=True``, 16 new tokens, scored with the demo's ``score``. It runs inside a
``TrainerCallback.on_step_end`` after the step's clock has stopped, so it is not on the clock.

The clock: ``train_seconds`` sums the ``on_step_begin`` -> ``on_step_end`` windows (generation +
reward + forward/backward + optimizer step; TRL generates inside ``training_step``), i.e. excludes
model loading, trainer construction and evaluations. ``train_wall_seconds`` is the wall-clock of
``trainer.train()`` minus evaluations (adds TRL's per-run setup and its between-step work such as
logging and fetching the batch).

    .venv/bin/python benchmarks/_trl_learning_curve.py --steps 2 --groups-per-step 2 \\
        --rollouts-per-group 4 --eval-every 1 --eval-size 8
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

from _trl_peer import (  # noqa: E402
    _default_model_dir,
    _offline_env,
    lora_qkvo,
    one_step_per_batch,
    quiet_trainer_args,
)
from demo_task import add_task_arguments  # noqa: E402

EVAL_BATCH = 32


def _ordered_batches(
    train_questions: list[Any], groups_per_step: int, steps: int
) -> list[list[Any]]:
    """The first ``steps`` batches of questions, exactly as our demo loop iterates them."""
    import art_core as art

    batches: list[list[Any]] = []
    for batch in art.iterate_dataset(
        train_questions, groups_per_step, num_epochs=100, use_tqdm=False
    ):
        if batch.step >= steps:
            break
        batches.append(list(batch.items))
    return batches


def run_trl_curve(
    model_dir: str,
    *,
    steps: int,
    groups_per_step: int,
    rollouts_per_group: int,
    learning_rate: float,
    eval_every: int,
    train_questions: int = 200,
    eval_size: int = 64,
    seed: int = 0,
) -> dict:
    """Train TRL GRPOTrainer on the demo task; held-out reward against training seconds."""
    _offline_env()
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from demo_task import MAX_TOKENS, Question, score, split
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        TrainerCallback,
    )
    from trl import GRPOConfig, GRPOTrainer

    if steps < 1 or groups_per_step < 1 or rollouts_per_group < 2 or eval_every < 0:
        raise ValueError("need steps >= 1, groups_per_step >= 1, rollouts_per_group >= 2")

    train_qs, held_out = split(train_questions, eval_size, seed=seed)
    batches = _ordered_batches(train_qs, groups_per_step, steps)
    # RepeatSampler takes `groups_per_step` consecutive rows per step and drops a short tail; our
    # loop keeps a short last batch of an epoch. Only then can the two orders differ.
    partial = [i for i, b in enumerate(batches) if len(b) != groups_per_step]
    if partial:
        print(
            f"warning: our batches {partial} are short (train_questions % groups_per_step != 0); "
            "TRL's fixed-size steps cannot reproduce them, the data order will drift",
            file=sys.stderr,
        )
    flat = [q for b in batches for q in b]
    if len(flat) < steps * groups_per_step:  # only with partial batches: pad by cycling
        flat += flat[: steps * groups_per_step - len(flat)]
    dataset = Dataset.from_list(
        [{"prompt": q.messages(), "a": q.a, "b": q.b} for q in flat[: steps * groups_per_step]]
    )
    batch = groups_per_step * rollouts_per_group

    seen_steps: list[list[tuple[int, int]]] = []
    samples: list[dict[str, Any]] = []  # the first completion of each step, for a look

    def demo_reward(completions: list[Any], a: list[int], b: list[int], **_: Any) -> list[float]:
        """The demo's score()["reward"] of each completion's text."""
        order: list[tuple[int, int]] = []
        rewards = []
        for completion, qa, qb in zip(completions, a, b, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            rewards.append(score(Question(int(qa), int(qb)), text)["reward"])
            if not order or order[-1] != (int(qa), int(qb)):
                order.append((int(qa), int(qb)))
        seen_steps.append(order)
        if completions:
            first = completions[0]
            samples.append(
                {
                    "question": Question(int(a[0]), int(b[0])).text,
                    "completion": first[-1]["content"] if isinstance(first, list) else str(first),
                    "reward": rewards[0],
                }
            )
        return rewards

    tokenizer = AutoTokenizer.from_pretrained(
        model_dir, padding_side="left", truncation_side="left"
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_curve_"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        use_vllm=False,
        # batch geometry: one optimizer step = groups_per_step x rollouts_per_group completions
        **one_step_per_batch(batch, rollouts_per_group),
        shuffle_dataset=False,
        # sampling
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_completion_length=MAX_TOKENS,
        # loss
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        mask_truncated_completions=False,
        # optimizer: AdamW as ours (betas 0.9/0.99), constant lr, clip 1.0
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        max_steps=steps,
        gradient_checkpointing=False,  # GRPOConfig defaults it to True; ours is off by default
        **quiet_trainer_args(seed),
    )
    peft_config = lora_qkvo()

    points: list[dict[str, Any]] = []
    step_logs: list[dict[str, Any]] = []
    clock = {"train": 0.0, "eval": 0.0, "t0": 0.0}
    holder: dict[str, Any] = {}

    prompts_text = [
        tokenizer.apply_chat_template(q.messages(), add_generation_prompt=True, tokenize=False)
        for q in held_out
    ]

    def evaluate() -> float:
        """Greedy held-out answers of the current policy (adapter active); mean reward."""
        trainer = holder["trainer"]
        policy = trainer.accelerator.unwrap_model(trainer.model)
        was_training = policy.training
        policy.eval()
        eos = list(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])
        gen_config = GenerationConfig(
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=eos,
            use_cache=True,
        )
        rewards: list[float] = []
        try:
            with torch.inference_mode():
                for i in range(0, len(held_out), EVAL_BATCH):
                    enc = tokenizer(
                        prompts_text[i : i + EVAL_BATCH],
                        return_tensors="pt",
                        padding=True,
                        add_special_tokens=False,
                    )
                    out = policy.generate(**enc, generation_config=gen_config)
                    texts = tokenizer.batch_decode(
                        out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
                    )
                    rewards += [
                        score(q, t)["reward"]
                        for q, t in zip(held_out[i : i + EVAL_BATCH], texts, strict=True)
                    ]
        finally:
            if was_training:
                policy.train()
        return sum(rewards) / len(rewards) if rewards else 0.0

    def lora_b_norm() -> float:
        """Norm of all LoRA B matrices: 0 at the start, grows once the policy moves."""
        sq = sum(
            float(p.detach().pow(2).sum())
            for n, p in holder["trainer"].model.named_parameters()
            if "lora_B" in n
        )
        return sq**0.5

    def eval_point(step: int) -> None:
        t = time.perf_counter()
        reward = evaluate()
        t_end = time.perf_counter()
        clock["eval"] += t_end - t
        points.append(
            {
                "step": step,
                "train_seconds": clock["train"],
                "train_wall_seconds": (
                    t_end - clock["wall0"] - clock["eval"] if "wall0" in clock else 0.0
                ),
                "heldout_reward": reward,
                "eval_seconds": t_end - t,
                "lora_b_norm": lora_b_norm(),
            }
        )
        print(f"  trl step {step}: {clock['train']:.1f}s, held-out {reward:.3f}", file=sys.stderr)

    class _CurveCallback(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            clock["train"] += time.perf_counter() - clock["t0"]
            step = state.global_step
            if (eval_every and step % eval_every == 0) or step == steps:
                eval_point(step)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                step_logs.append(
                    {
                        "step": state.global_step,
                        "train_reward": logs.get("reward"),
                        "loss": logs.get("loss"),
                        "mean_length": logs.get("completions/mean_length"),
                    }
                )

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=demo_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_CurveCallback()],
    )
    holder["trainer"] = trainer

    eval_point(0)  # the adapter starts at B = 0: this is the base model
    clock["eval"] = 0.0
    clock["wall0"] = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train()
    wall = time.perf_counter() - clock["wall0"] - clock["eval"]
    final_step = trainer.state.global_step
    if points[-1]["step"] != final_step:  # training stopped early: still report the end
        eval_point(final_step)

    expected = [[(q.a, q.b) for q in b] for b in batches]
    order_matched = not partial and seen_steps == expected
    return {
        "contender": "trl",
        "points": points,
        "steps_log": step_logs,
        "sample_completions": samples,
        "data_order_matched": order_matched,
        "steps_trained": final_step,
        "train_wall_seconds": wall,
        "settings": {
            "steps": steps,
            "groups_per_step": groups_per_step,
            "rollouts_per_group": rollouts_per_group,
            "learning_rate": learning_rate,
            "lr_scheduler": "constant",
            "adam_betas": [0.9, 0.99],
            "weight_decay": 0.0,
            "max_grad_norm": 1.0,
            "eval_every": eval_every,
            "train_questions": train_questions,
            "eval_size": eval_size,
            "seed": seed,
            "temperature": 1.0,
            "max_completion_length": MAX_TOKENS,
            "loss_type": "dapo",
            "epsilon": [0.2, 0.28],
            "scale_rewards": "group",
            "beta": 0.0,
            "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "targets": ["q", "k", "v", "o"]},
            "dtype": "float32",
            "shuffle_dataset": False,
            "gradient_checkpointing": False,
            "torch_threads": torch.get_num_threads(),
            "model_dir": str(model_dir),
        },
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }


def run_trl_curve_in_subprocess(
    model_dir: str, timeout: float | None = None, **kwargs: Any
) -> dict:
    """Run :func:`run_trl_curve` in a fresh interpreter; its log goes to this process's stderr."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps({"model_dir": str(model_dir), **kwargs}),
    ]
    tail: collections.deque[str] = collections.deque(maxlen=200)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail.append(line)
                if line.startswith("  trl step") or line.startswith("warning:"):
                    sys.stderr.write(line)
                    sys.stderr.flush()

        out: list[str] = []

        def collect() -> None:
            assert proc.stdout is not None
            out.append(proc.stdout.read())

        readers = [threading.Thread(target=f, daemon=True) for f in (pump, collect)]
        for r in readers:
            r.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            for r in readers:
                r.join(timeout=10)
        stdout = "".join(out)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL curve failed (rc={proc.returncode}):\n{''.join(tail)[-4000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None)
    add_task_arguments(ap, eval_every=2)  # learning_curve.py's defaults
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None)
    ns = ap.parse_args(argv)

    if ns.child:
        kw = json.loads(ns.child)
        res = run_trl_curve(kw.pop("model_dir"), **kw)
        sys.stdout.write(json.dumps(res) + "\n")
        return

    res = run_trl_curve_in_subprocess(
        ns.model_dir or _default_model_dir(),
        timeout=ns.timeout,
        steps=ns.steps,
        groups_per_step=ns.groups_per_step,
        rollouts_per_group=ns.rollouts_per_group,
        learning_rate=ns.learning_rate,
        eval_every=ns.eval_every,
        train_questions=ns.train_questions,
        eval_size=ns.eval_size,
        seed=ns.seed,
    )
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
