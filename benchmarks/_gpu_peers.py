"""The GPU smoke benchmark's peers, run in the same invocation as ours on the same model:
HF `generate()` at each batch size of the serving ladder, and TRL's `GRPOTrainer` for the step.

`generate_peer` renders the same chat prompts the server receives, left-pads them into one batch
per size and samples `new_tokens` at temperature 1 (top-k off) with `min_new_tokens` equal to it,
so that, as with our EOS-banning `logit_bias`, every row generates exactly that many tokens.
tokens/s = rows x new_tokens / wall time (the device synchronised), median of `runs` after a
warm-up. The model loads in the dtype the server chose.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any


def torch_dtype(name: str) -> Any:
    """`bfloat16` / `float32` (as /health or the server log name it) as a torch dtype."""
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name.removeprefix("torch.")]


def generate_peer(
    folder: Path,
    *,
    device: str,
    dtype: str,
    prompts: list[str],
    rows_ladder: list[int],
    new_tokens: int,
    runs: int,
) -> dict[str, Any]:
    """HF `generate()` tokens/s at each batch size in `rows_ladder` (prompts cycled to fill)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(dtype)).to(device)
    model.eval()
    rendered = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        for prompt in prompts
    ]
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def once(rows: int) -> float:
        texts = [rendered[index % len(rendered)] for index in range(rows)]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        batch = {key: value.to(device) for key, value in batch.items()}
        _synchronize(device)
        started = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        _synchronize(device)
        generated = (output.shape[1] - batch["input_ids"].shape[1]) * rows
        return generated / (time.perf_counter() - started)

    once(rows_ladder[0])  # warm-up: first kernels, allocator growth
    result: dict[str, Any] = {}
    for rows in rows_ladder:
        measured = [once(rows) for _ in range(runs)]
        result[str(rows)] = {
            "median_tokens_per_second": round(statistics.median(measured), 1),
            "runs": [round(value, 1) for value in measured],
        }
        print(f"   generate() {rows} rows: {result[str(rows)]}", flush=True)
    return result


def trl_peer(
    folder: Path, *, device: str, dtype: str, prompts: list[str], new_tokens: int, steps: int
) -> dict[str, Any]:
    """TRL's `GRPOTrainer` step on the same model: 4 prompts x 4 completions, LoRA r16 on
    q/k/v/o, dapo loss, beta 0, lr 1e-5, full-length completions (`_trl_peer.py`)."""
    from _trl_peer import run_trl_in_subprocess

    return run_trl_in_subprocess(
        str(folder),
        prompts=prompts,
        num_generations=4,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        steps=steps,
        warmup=1,
        bf16_autocast=dtype == "bfloat16",
        learning_rate=1e-5,
        device=device,
    )


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
