"""A long prompt's first token: our engine (bf16 as served) against `generate()`, SmolLM2-135M.

    .venv/bin/python benchmarks/long_prompt.py [--lengths 512,2048] [--repeats 3]
        [--baseline CHECKOUT] [--shape smollm2|tiny] [--out PATH]

An agent's prompt (a system prompt, tools, the turns so far) runs to thousands of tokens, and
its first token waits for the prefill of all of them: in bf16 on a CPU our engine computes that
prefill's attention in float64 (the batch-invariant attention, `engines/_batch_invariant.py`),
so that the sampler's logprobs are the trainer's bit for bit. For each prompt length, one
request of random token ids, one sampled token (seeded), the seconds from submitting it to its
end:
- `ours`: the torch engine as `art-server` serves bf16 (batch-invariant attention on);
- `ours_not_invariant`: the same with `ART_BATCH_INVARIANT=0` (SDPA): what the bit equality
  costs at that length;
- `generate`: transformers' `generate(max_new_tokens=1)` in bf16 (SDPA), the peer;
- `baseline` (with `--baseline CHECKOUT`): our engine from another checkout, and whether its
  token and logprob equal ours (`equal_to_baseline`).
Each contender in a process of its own (a short prompt first, out of the figures), the
contenders in turns, medians of `--repeats`; the other processes' load beside each figure.

`--shape tiny`: the test suite's tiny random model, short prompts, one run: for the test of the
JSON's keys; its figures mean nothing. Writes benchmarks/results/long_prompt.json and its
BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import OtherLoad, checkout_commit, machine_info
from _markdown import publish
from _tiny_model import build_tiny_model

RESULTS = Path(__file__).resolve().parent / "results" / "long_prompt.json"
START, END = "<!-- long_prompt:start -->", "<!-- long_prompt:end -->"
SHAPES = {
    "smollm2": {"lengths": "512,2048", "warm_up": 64, "repeats": 3},
    "tiny": {"lengths": "40,200", "warm_up": 8, "repeats": 1},
}


def child(contender: str, folder: str, lengths: list[int], warm_up: int) -> None:
    """Print a JSON list: for each length, [seconds, token, logprob]."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    vocab = model.config.get_text_config().vocab_size
    prompts = [
        torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in [warm_up, *lengths]
    ]
    figures = (
        _generate(model, prompts) if contender == "generate" else _ours(model, tokenizer, prompts)
    )
    print(json.dumps(figures[1:]))


def _ours(model: Any, tokenizer: Any, prompts: list[list[int]]) -> list[list[Any]]:
    from family_throughput import prepare_to_serve

    from art_backend.engines._engine import GenerationRequest, SamplingParams
    from art_backend.testing import TorchEngine

    prepare_to_serve(model)
    engine = TorchEngine(model, tokenizer, eos_token_ids=[], context_length=8192)
    engine.start()

    async def first_token(ids: list[int]) -> list[Any]:
        params = SamplingParams(max_new_tokens=1, temperature=1.0, seed=0)
        started = time.perf_counter()
        queue = engine.submit(GenerationRequest(prompt_ids=ids, params=params, stream_tokens=False))
        done = await queue.get()
        assert done.error is None, done.error
        return [time.perf_counter() - started, done.token_ids[0], done.logprobs[0]]

    try:
        return [asyncio.run(first_token(ids)) for ids in prompts]
    finally:
        engine.stop()


def _generate(model: Any, prompts: list[list[int]]) -> list[list[Any]]:
    import torch

    model.generation_config.eos_token_id = None
    figures = []
    for ids in prompts:
        torch.manual_seed(0)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]), do_sample=True, top_k=0, max_new_tokens=1, pad_token_id=0
            )
        figures.append([time.perf_counter() - started, int(out[0, -1]), None])
    return figures


def measure(contender: str, folder: str, args: argparse.Namespace) -> list[list[Any]]:
    environment = dict(os.environ)
    if contender == "ours_not_invariant":
        environment["ART_BATCH_INVARIANT"] = "0"
    if contender == "baseline":  # the other checkout's engine, this checkout's benchmark
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(Path(args.baseline).resolve() / "backend"), environment.get("PYTHONPATH", "")]
        )
    name = "generate" if contender == "generate" else "ours"
    command = [
        sys.executable, __file__, "--child", name, "--folder", folder,
        "--lengths", args.lengths, "--warm-up", str(args.warm_up),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        raise RuntimeError(f"{contender} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(folder: str, args: argparse.Namespace) -> dict[str, Any]:
    contenders = ["ours", "ours_not_invariant", "generate"] + (
        ["baseline"] if args.baseline else []
    )
    lengths = [int(n) for n in args.lengths.split(",")]
    seconds: dict[str, list[list[float]]] = {name: [[] for _ in lengths] for name in contenders}
    firsts: dict[str, list[Any]] = {}
    cores: list[float] = []
    for _ in range(args.repeats):
        for contender in contenders:
            with OtherLoad() as load:
                figures = measure(contender, folder, args)
            cores.append(round(load.cores, 2))
            firsts.setdefault(contender, [figure[1:] for figure in figures])
            for index, figure in enumerate(figures):
                seconds[contender][index].append(round(figure[0], 3))
    rows = []
    for index, length in enumerate(lengths):
        median = {name: statistics.median(seconds[name][index]) for name in contenders}
        row = {
            "prompt_tokens": length,
            "seconds": median,
            "generate_over_ours": round(median["generate"] / median["ours"], 3),
            "invariance_cost": round(median["ours"] / median["ours_not_invariant"], 3),
            "runs": {name: seconds[name][index] for name in contenders},
        }
        if args.baseline:
            row["baseline_over_ours"] = round(median["baseline"] / median["ours"], 3)
            row["equal_to_baseline"] = firsts["ours"][index] == firsts["baseline"][index]
        rows.append(row)
    return {"rows": rows, "other_cores_max": max(cores), "other_cores": cores}


def section(result: dict[str, Any]) -> str:
    machine, baseline = result["machine"], result.get("baseline")
    lines = [
        START,
        "## A long prompt's first token: ours vs `generate()` (`benchmarks/long_prompt.py`)",
        "",
        f"Measured {machine['date']} on {machine['cpu_count']} cores ({machine['cpu_model']}), "
        f"{result['model']}, bf16, one request of random token ids, one sampled token: seconds "
        f"from submitting it to its end; medians of {result['repeats']} runs, each contender in "
        f"a process of its own, in turns. Other processes used at most "
        f"{result['other_cores_max']} cores during any run.",
        "",
        "| prompt tokens | ours (s) | ours, `ART_BATCH_INVARIANT=0` | `generate()` "
        "| generate / ours | invariance cost |"
        + (" baseline (s) | baseline / ours | same token and logprob |" if baseline else ""),
        "|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---|" if baseline else ""),
    ]
    for row in result["rows"]:
        time_of = row["seconds"]
        line = (
            f"| {row['prompt_tokens']} | {time_of['ours']:.2f} "
            f"| {time_of['ours_not_invariant']:.2f} | {time_of['generate']:.2f} "
            f"| **{row['generate_over_ours']}x** | {row['invariance_cost']}x |"
        )
        if baseline:
            same = "yes" if row["equal_to_baseline"] else "**no**"
            line += f" {time_of['baseline']:.2f} | **{row['baseline_over_ours']}x** | {same} |"
        lines.append(line)
    lines += [
        "",
        "*generate / ours* above 1: ours is faster. *Invariance cost*: ours against ours with "
        "SDPA (the bit equality's price at that length)."
        + (f" Baseline: our engine at commit `{baseline}`, in the same run." if baseline else ""),
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--lengths", help="prompt lengths, comma-separated")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--baseline", help="another checkout's engine, in the same run")
    parser.add_argument("--out", type=Path, help="write the JSON here (BENCHMARKS.md untouched)")
    parser.add_argument("--child", choices=("ours", "generate"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = SHAPES[args.shape]
    args.lengths = args.lengths or shape["lengths"]
    args.repeats = args.repeats or shape["repeats"]
    args.warm_up = args.warm_up or shape["warm_up"]
    if args.child:
        child(args.child, args.folder, [int(n) for n in args.lengths.split(",")], args.warm_up)
        return
    with tempfile.TemporaryDirectory() as scratch:
        if args.shape == "tiny":
            folder, model = str(build_tiny_model(Path(scratch) / "tiny")), "the tiny model"
        else:
            sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
            from art_backend.engines._loading import ensure_default_model

            folder, model = str(ensure_default_model()), "SmolLM2-135M-Instruct"
        result = {
            "machine": machine_info("torch", "transformers"),
            "model": model,
            "repeats": args.repeats,
            "baseline": checkout_commit(args.baseline) if args.baseline else None,
            **bench(folder, args),
        }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(section(result))
    else:
        publish(result, RESULTS, START, END, section(result))


if __name__ == "__main__":
    main()
