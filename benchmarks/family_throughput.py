"""Serving throughput per architecture family: our torch engine against batched `generate()`.

    .venv/bin/python benchmarks/family_throughput.py [--repeats 3] [--quick]

A regression that hits one family (a cache layer type, a mask, an attention kernel) shows here as
that family's ratio falling while the others hold. Two parts, each measurement in a
process of its own (see `measure_in_child`), the two contenders alternating, medians of
`--repeats` runs:

1. every family of the test matrix (tests/support/tiny_families.py) at a small shape (hidden
   256, 4 layers, head size 64; sliding windows of 8 tokens, so every prompt passes them);
2. two families at SmolLM2-135M's size: SmolLM2-135M-Instruct itself (Llama; the embedded GGUF,
   converted) and a random Gemma 3 of the same dimensions (sliding + full layers, 5:1, the window
   cut to 64 tokens so that these prompts pass it).

The workload: 16 requests at once, distinct prompts of 20 to 120 tokens, 64 tokens each, sampled
at temperature 1 with no end token (every row runs its 64). Ours: the torch engine in process
(`TorchEngine`, continuous batching, the requests submitted together); the peer: one left-padded
`model.generate()` of the same 16 prompts (`min_new_tokens` = `max_new_tokens` = 64). tokens/s =
generated tokens / wall time. float32. The CPU time other processes used during each
measurement is recorded beside it (`other_cores`).

Writes benchmarks/results/family_throughput.json and its BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's tests/

import torch
from _machine import OtherLoad, machine_info
from _markdown import publish

from tests.support.tiny_families import FAMILIES, build_family_model

RESULTS = Path(__file__).resolve().parent / "results" / "family_throughput.json"
START, END = "<!-- family_throughput:start -->", "<!-- family_throughput:end -->"
ROWS, NEW_TOKENS = 16, 64
SMALL = {"hidden_size": 256, "heads": 4, "kv_heads": 2}
GEMMA3_AT_SMOLLM2 = {  # SmolLM2-135M's dimensions, Gemma 3's layer pattern
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "sliding_window": 64,
    "layer_types": [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(30)
    ],
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """ROWS distinct prompts of 20 to 120 random token ids (special ids kept out)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(20, 120, ROWS).long().tolist()
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def measure_ours(model: Any, tokenizer: Any, batch: list[list[int]]) -> float:
    """tokens/s of the torch engine serving `batch` as concurrent requests."""
    from art_backend.engines._engine import FinishEvent, GenerationRequest, SamplingParams
    from art_backend.testing import TorchEngine

    engine = TorchEngine(
        model, tokenizer, eos_token_ids=[], context_length=4096, max_batch_size=ROWS
    )
    engine.start()

    async def serve() -> int:
        queues = [
            engine.submit(
                GenerationRequest(
                    prompt_ids=ids,
                    params=SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=row),
                    stream_tokens=False,
                )
            )
            for row, ids in enumerate(batch)
        ]
        events = [await queue.get() for queue in queues]
        assert all(isinstance(e, FinishEvent) and e.error is None for e in events), events
        return sum(len(e.token_ids) for e in events)

    try:
        started = time.perf_counter()
        tokens = asyncio.run(serve())
        return tokens / (time.perf_counter() - started)
    finally:
        engine.stop()


def measure_generate(model: Any, batch: list[list[int]]) -> float:
    """tokens/s of one left-padded `generate()` of `batch`."""
    longest = max(len(ids) for ids in batch)
    input_ids = torch.zeros((len(batch), longest), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(batch):
        input_ids[row, longest - len(ids) :] = torch.tensor(ids)
        mask[row, longest - len(ids) :] = 1
    model.generation_config.eos_token_id = None
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            input_ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=0,
        )
    tokens = (output.shape[1] - longest) * len(batch)
    return tokens / (time.perf_counter() - started)


def measure_in_child(contender: str, folder: Path) -> float:
    """tokens/s of one contender on `folder`, measured in a fresh interpreter after a warm-up.

    Each measurement gets a process of its own: torch's OpenMP thread pool belongs to the
    thread that first ran an operator, and a pool left spinning by `generate()` on the main
    thread takes the cores from the engine's own thread (its forward measured 2.8x slower
    here beside one). A served engine has its process to itself; so does each contender here.
    """
    command = [sys.executable, __file__, "--child", contender, str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{contender} on {folder} failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def child(contender: str, folder: Path) -> None:
    """The child side of `measure_in_child`: print one tokens/s figure."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    batch = prompts(model.config.get_text_config().vocab_size)
    if contender == "ours":
        measure_ours(model, tokenizer, batch[:2])  # warm-up: first-call costs out of the figure
        print(measure_ours(model, tokenizer, batch))
    else:
        measure_generate(model, batch[:2])
        print(measure_generate(model, batch))


def bench_model(name: str, family: str, folder: Path, repeats: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"ours": [], "generate": [], "other_cores": []}
    for _ in range(repeats):
        for contender in ("ours", "generate"):
            with OtherLoad() as load:
                rate = measure_in_child(contender, folder)
            runs[contender].append(rate)
            runs["other_cores"].append(load.cores)
    ours, peer = statistics.median(runs["ours"]), statistics.median(runs["generate"])
    result = {
        "model": name,
        "family": family,
        "ours_tokens_per_s": round(ours, 1),
        "generate_tokens_per_s": round(peer, 1),
        "ratio": round(ours / peer, 3),
        "other_cores_max": round(max(runs["other_cores"]), 2),
        "runs": {key: [round(v, 2) for v in values] for key, values in runs.items()},
    }
    print(result, flush=True)
    return result


def build_gemma3_at_smollm2(folder: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

    from art_backend.engines._loading import ensure_default_model

    smollm2 = ensure_default_model()
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(folder)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Gemma3TextConfig(**GEMMA3_AT_SMOLLM2)).save_pretrained(folder)
    return folder


def section(result: dict[str, Any]) -> str:
    lines = [
        START,
        "## Serving throughput per family: torch engine vs `generate()` "
        "(`benchmarks/family_throughput.py`)",
        "",
        f"Measured {result['machine']['date']} on {result['machine']['cpu_count']} cores "
        f"({result['machine']['cpu_model']}), float32, {ROWS} concurrent requests x "
        f"{NEW_TOKENS} sampled tokens, prompts of 20-120 tokens; medians of "
        f"{result['repeats']} runs. `other cores`: the most CPU other processes used during "
        "any run of that model (the machine is shared).",
        "",
        "| model | family | ours tok/s | `generate()` tok/s | ours / generate | other cores |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in result["models"]:
        lines.append(
            f"| {row['model']} | {row['family']} | {row['ours_tokens_per_s']} | "
            f"{row['generate_tokens_per_s']} | {row['ratio']}x | {row['other_cores_max']} |"
        )
    lines += ["", result["notes"], END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small shapes only, 1 run, no write")
    parser.add_argument("--child", nargs=2, metavar=("CONTENDER", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    repeats = 1 if args.quick else args.repeats
    models = []
    with tempfile.TemporaryDirectory() as scratch:
        for family in FAMILIES:
            folder = build_family_model(family, Path(scratch) / family.name, shape=SMALL)
            models.append(bench_model(f"small {family}", family.name, folder, repeats))
        if not args.quick:
            from art_backend.engines._loading import ensure_default_model

            models.append(bench_model("SmolLM2-135M", "llama", ensure_default_model(), repeats))
            gemma3 = build_gemma3_at_smollm2(Path(scratch) / "gemma3-135m")
            models.append(bench_model("Gemma 3 at SmolLM2's size", "gemma3", gemma3, repeats))
    result = {
        "machine": machine_info("torch", "transformers"),
        "repeats": repeats,
        "workload": {"rows": ROWS, "new_tokens": NEW_TOKENS, "dtype": "float32"},
        "models": models,
        "notes": NOTES,
    }
    if args.quick:
        print(section(result))
        return
    publish(result, RESULTS, START, END, section(result))


NOTES = (
    "Read the ratios down a column, not as a verdict on the engine: a family whose ratio falls "
    "while the others hold has regressed. Every measurement runs in a process of its own. The "
    "first version of this benchmark ran both contenders in one process and put ours at "
    "0.40-0.72x on the small shapes: `generate()` on the main thread left torch's OpenMP pool "
    "spinning beside the engine's thread, whose forward then took 5.7 ms a step instead of "
    "2.1 ms (measured with /metrics' split of the decode step). At SmolLM2's size the Gemma 3 "
    "layout's sliding layers keep their whole history in our cache (the window comes from the "
    "mask; docs/models.md), while `generate()`'s keep only the window, here 64 of up to 184 "
    "tokens."
)


if __name__ == "__main__":
    main()
