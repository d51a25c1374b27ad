"""Decode through a served LoRA adapter: PEFT's layer forward against ours, and the base model.

    .venv/bin/python benchmarks/lora_decode.py [--dtypes bfloat16,float32] [--runs 6]
        [--shape smollm2|tiny] [--out PATH]

The torch engine's decode loop (driven on this thread, as `machine_limit.py` does) over 16
rows x 64 prompt tokens, 64 sampled tokens, SmolLM2-135M as served, through a random LoRA
adapter (r16, alpha 32) on the seven projections a trainer adapts by default. In one process,
in turns (`--runs` each, medians): the adapter's layers with PEFT's own `lora.Linear.forward`,
with the engine's lean forward (`engines/_lora_forward.py`), and the same engine's rows without
an adapter (a second engine on its own copy of the model). The logits of both forwards are
compared bit for bit on a prompt-sized forward and a one-row one (`logits_equal`).

`--shape tiny`: the test suite's tiny random model, a few tokens: for the test of the JSON's
keys; its figures mean nothing. Writes benchmarks/results/lora_decode.json and its
BENCHMARKS.md section.
"""

from __future__ import annotations

import copy
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests/ (the tiny model)

from _limit_figures import _OurDecode, load_model, prompts
from _machine import OtherLoad
from _turns import run_in_turns

RESULTS = Path(__file__).resolve().parent / "results" / "lora_decode.json"
START, END = "<!-- lora_decode:start -->", "<!-- lora_decode:end -->"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SHAPES = {
    "smollm2": {"rows": 16, "prompt_tokens": 64, "new_tokens": 64},
    "tiny": {"rows": 4, "prompt_tokens": 8, "new_tokens": 4},
}


def measure(model_dir: str, dtype: str, shape: dict[str, int], runs: int) -> dict[str, Any]:
    """The three contenders on one dtype, in turns; medians of ms per decode step."""
    from peft.tuners.lora.layer import Linear

    spec = {"model_dir": model_dir, "dtype": dtype, "contender": "ours", **shape}
    model, tokenizer = load_model(spec)
    base = _OurDecode(copy.deepcopy(model), tokenizer, spec)
    adapted = _OurDecode(model, tokenizer, {**spec, "adapter": True, "lora_targets": TARGETS})
    layers = [m for m in adapted.engine.model.modules() if type(m) is Linear]
    lean = {id(m): vars(m).pop("forward") for m in layers}  # PEFT's forward until put back

    def use(ours: bool) -> None:
        for layer in layers:
            if ours:
                layer.forward = lean[id(layer)]
            else:
                vars(layer).pop("forward", None)

    batch = prompts(model.config.vocab_size, shape["rows"], shape["prompt_tokens"])
    steps: dict[str, list[float]] = {"base": [], "peft": [], "ours": []}
    with OtherLoad() as load, torch.inference_mode():
        for name in steps:  # a warm-up of each
            use(name == "ours")
            (base if name == "base" else adapted)(batch, shape["new_tokens"])
        for _ in range(runs):
            for name in steps:
                use(name == "ours")
                run = (base if name == "base" else adapted)(batch, shape["new_tokens"])
                steps[name].append(1000 * run["decode_s"] / (shape["new_tokens"] - 1))
    medians = {name: statistics.median(values) for name, values in steps.items()}
    return {
        "dtype": dtype,
        "adapter_layers": len(layers),
        "ms_per_step": {name: round(value, 2) for name, value in medians.items()},
        "runs_ms": {name: [round(v, 2) for v in values] for name, values in steps.items()},
        "ours_vs_peft": round(medians["ours"] / medians["peft"], 3),
        "adapter_cost_peft_ms": round(medians["peft"] - medians["base"], 2),
        "adapter_cost_ours_ms": round(medians["ours"] - medians["base"], 2),
        "logits_equal": _logits_equal(adapted.engine, use, batch),
        "other_cores": round(load.cores, 2),
    }


def _logits_equal(engine: Any, use: Any, batch: list[list[int]]) -> bool:
    """Whether both forwards give the same logits, bit for bit, on the prompts and on one row."""
    engine.model.set_adapter(engine.adapters["bench@1"])
    ids = torch.tensor(batch)
    logits = {}
    with torch.inference_mode():
        for ours in (False, True):
            use(ours)
            logits[ours] = [engine.model(input_ids=x).logits for x in (ids, ids[:1, :1])]
    return all(torch.equal(a, b) for a, b in zip(logits[False], logits[True], strict=True))


def section(result: dict[str, Any]) -> str:
    shape = result["workload"]
    lines = [
        START,
        "## Decode through a served LoRA adapter: PEFT's layers vs ours (`benchmarks/lora_decode.py`)",
        "",
        f"{result['when'][:10]}, {result['machine']['cpu_model']}, "
        f"{result['machine']['torch_threads']} threads. {result['model']}, {shape['rows']} rows x {shape['prompt_tokens']} prompt "
        f"tokens, {shape['new_tokens']} sampled; a random LoRA (r16) on q, k, v, o, gate, up and "
        f"down. The engine's decode loop, the three in turns in one process, medians of "
        f"{result['runs']} runs.",
        "",
        "| dtype | LoRA layers | base model (ms/step) | PEFT's forward | ours | ours / PEFT "
        "| adapter's cost, PEFT -> ours (ms/step) | logits equal | other load (cores) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for figure in result["figures"]:
        ms = figure["ms_per_step"]
        lines.append(
            f"| {figure['dtype']} | {figure['adapter_layers']} | {ms['base']:.1f} "
            f"| {ms['peft']:.1f} | {ms['ours']:.1f} | **{figure['ours_vs_peft']:.2f}x** "
            f"| {figure['adapter_cost_peft_ms']:.1f} -> {figure['adapter_cost_ours_ms']:.1f} "
            f"| {'yes' if figure['logits_equal'] else '**no**'} | {figure['other_cores']:.2f} |"
        )
    lines += [
        "",
        "Ours runs PEFT's operations without its per-call work (docs/performance.md, "
        '"Served LoRA layers"); "logits equal" compares both on the prompts and on one row.',
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_in_turns(
        argv, sys.modules[__name__], dtypes="bfloat16,float32", packages=("torch", "peft")
    )


if __name__ == "__main__":
    main()
