"""The Tinker cookbook's chat_sl, math_rl, DPO and distillation recipes on SmolLM2 through
art-server: a handful of steps each with the recipes' own defaults, their metric trends recorded.

One art-server (a child process on 127.0.0.1, `smollm2-135m-instruct` in its default dtype)
for the four; each recipe runs through its own entry point (examples/tinker_cookbook_recipes.py
says what is overridden and why), one after the other, with the model named by its hub id (the
tokenizer registered from the local folder: nothing is downloaded). Beside each run: its wall
time, the CPU cores other processes used meanwhile and the 1-minute load average before it.

    .venv/bin/python benchmarks/cookbook_recipes.py [--only chat_sl dpo]

Writes benchmarks/results/cookbook_recipes.json and its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from _art_server import start_art_server
from _machine import OtherLoad, machine_info
from _markdown import publish
from tinker_cookbook_recipes import RECIPES, RecipeRun, metrics, use_local_tokenizer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cookbook_recipes.json"
START, END = "<!-- cookbook_recipes:start -->", "<!-- cookbook_recipes:end -->"
SERVED = "smollm2-135m-instruct"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what a cookbook user names it
KEY = "tml-bench-key"

# Per recipe: steps, and the batch (sequences for chat_sl, pairs for DPO, groups of the recipe's
# default 4 samples for math_rl and distillation).
SIZES = {"chat_sl": (8, 8), "math_rl": (6, 8), "dpo": (6, 8), "distillation": (4, 2)}
# The metrics whose trend the section shows (all of them are in the JSON).
TRENDS = {
    "chat_sl": ["train_mean_nll"],
    "math_rl": ["env/all/reward/total", "env/all/correct", "optim/kl_sample_train_v1"],
    "dpo": ["dpo_loss", "accuracy", "margin"],
    "distillation": ["teacher_kl", "optim/kl_sample_train_v1"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--max-tokens", type=int, default=32, help="distillation's samples")
    return parser.parse_args(argv)


def run_one(name: str, url: str, folder: Path, max_tokens: int) -> dict[str, Any]:
    """One recipe, timed, beside the machine's other load; its per-step metric rows."""
    steps, batch = SIZES[name]
    run = RecipeRun(url, HUB_ID, folder / name, steps, batch, max_tokens)
    loadavg = os.getloadavg()[0]
    started = time.monotonic()
    with OtherLoad() as load:
        RECIPES[name](run)
    rows = [row for row in metrics(run.log_path) if "progress" in row or "progress/batch" in row]
    return {
        "steps": len(rows),
        "batch": batch,
        "seconds": round(time.monotonic() - started, 1),
        "other_cores": round(load.cores, 2),
        "loadavg_1min_before": round(loadavg, 2),
        "trends": {key: [row.get(key) for row in rows] for key in TRENDS[name]},
        "rows": rows,
    }


def trend(values: list[float | None]) -> str:
    shown = [f"{v:.3g}" if isinstance(v, float | int) else "-" for v in values]
    return " → ".join(shown)


def section(result: dict[str, Any]) -> str:
    rows = []
    for name, run in result["recipes"].items():
        trends = "<br>".join(f"`{key}` {trend(v)}" for key, v in run["trends"].items())
        rows.append(
            f"| {name} | {run['steps']} × {run['batch']} | {trends} | {run['seconds']:.0f} s "
            f"| {run['other_cores']:.2f} | {run['loadavg_1min_before']:.1f} |"
        )
    machine = result["machine"]
    return f"""{START}
## The Tinker cookbook's recipes on SmolLM2 (`benchmarks/cookbook_recipes.py`, issue 52)

tinker-cookbook {machine["tinker_cookbook"]}'s own `chat_sl`, `math_rl` (arithmetic,
`stable_reinforce`), `preference/dpo` and `distillation/on_policy_distillation` (teacher: the
served base model) through their entry points with their defaults (learning rates, LoRA ranks,
losses, group size 4), against `art-server --model {SERVED}` on {machine["cpu_count"]} shared
CPU cores. Only the server, model, renderer (`qwen3_instruct`, SmolLM2's ChatML), sizes and
local data are overridden (examples/tinker_cookbook_recipes.py). Steps × batch: sequences,
pairs, or groups of 4 samples. A handful of steps shows each recipe runs and which way its
numbers go, not where they end. The model runs in its default dtype (bf16 here), where the
sampler's logprobs are the trainer's (the section "Sampler vs trainer logprobs"): math_rl's
`kl_sample_train` stays at ~1e-5 and distillation's first `teacher_kl` (the teacher is the
student's own base) is ~1e-5; before batch-invariant forwards they were 0.003–0.01 and 0.0014.
Other load: CPU cores
other processes used during the run; load average: 1 minute, before it.

| recipe | steps × batch | metric per step | wall | other load | load average |
| --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}
{END}"""


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    os.environ["TINKER_API_KEY"] = KEY
    from art_backend.testing import ensure_default_model

    use_local_tokenizer(HUB_ID, ensure_default_model())
    recipes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        process, url = start_art_server(SERVED, Path(folder) / "art", KEY)
        try:
            for name in args.only:
                recipes[name] = run_one(name, url, Path(folder), args.max_tokens)
                print(name, recipes[name]["seconds"], "s", recipes[name]["trends"], flush=True)
        finally:
            process.terminate()
            process.wait(30)
    result = {
        "recipes": recipes,
        "machine": machine_info("torch", "transformers", "tinker", "tinker_cookbook"),
    }
    publish(result, RESULTS, START, END, section(result))


if __name__ == "__main__":
    main()
