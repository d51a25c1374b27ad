"""q/k/v and gate/up in one packed call (`engines/_sibling_linear.py`) against one call a layer.

    .venv/bin/python benchmarks/sibling_linear.py [--dtypes bfloat16] [--runs 6]
        [--shape smollm2|tiny] [--out PATH]

SmolLM2-135M as served, in one process, in turns (`--runs` each, medians), the grouping on and
off (the members' group entries removed and put back; the weights and everything else
unchanged):
- decode: the torch engine's decode loop (driven on this thread, as `machine_limit.py` does),
  16 rows x 64 prompt tokens, 64 sampled tokens, through a random LoRA (r16) on q, k, v, o;
- train: the trainer's forward+backward and optimizer step on a GRPO step's rows (3 prompts
  of 40 tokens x 4 completions of 32, the prompt shared), LoRA r16 on q, k, v, o, as
  `train_step.py`'s adapter.
Both ways' logits (a prompt-sized forward and a one-row one) and the trainer's loss are
compared bit for bit (`equal`).

`--shape tiny`: the test suite's tiny random model with every layer packed (its layers are
under `MIN_WEIGHT`), a few tokens: for the test of the JSON's keys; its figures mean nothing.
Writes benchmarks/results/sibling_linear.json and its BENCHMARKS.md section.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests/ (the tiny model)

from _limit_figures import _OurDecode, grpo_trainer, load_model, prompts
from _machine import OtherLoad
from _turns import run_in_turns

RESULTS = Path(__file__).resolve().parent / "results" / "sibling_linear.json"
START, END = "<!-- sibling_linear:start -->", "<!-- sibling_linear:end -->"
SHAPES = {
    "smollm2": {"rows": 16, "prompt_tokens": 64, "new_tokens": 64, "groups": 3, "train_prompt": 40},
    "tiny": {"rows": 4, "prompt_tokens": 8, "new_tokens": 4, "groups": 1, "train_prompt": 6},
}


class Grouping:
    """The grouping of a model's members, switched off and on."""

    def __init__(self, model: Any) -> None:
        from art_backend.engines._sibling_linear import MEMBER

        self.key = MEMBER
        self.entries = {m: vars(m)[MEMBER] for m in model.modules() if MEMBER in vars(m)}

    def use(self, on: bool) -> None:
        for module, entry in self.entries.items():
            if on:
                vars(module)[self.key] = entry
            else:
                vars(module).pop(self.key, None)


def measure(model_dir: str, dtype: str, shape: dict[str, int], runs: int) -> dict[str, Any]:
    """Decode ms a step and the trainer's seconds a step, grouped and alone, in turns."""
    spec = {"model_dir": model_dir, "dtype": dtype, "contender": "ours", **shape}
    model, tokenizer = load_model(spec)
    trained = copy.deepcopy(model)
    decode = _OurDecode(model, tokenizer, {**spec, "adapter": True})  # LORA's q/k/v/o
    trainer, step = _trainer(trained, tokenizer, shape)
    groupings = [Grouping(decode.engine.model), Grouping(trainer.engine.model)]
    batch = prompts(model.config.vocab_size, shape["rows"], shape["prompt_tokens"])
    figures: dict[str, list[float]] = {
        f"{part}_{way}": [] for part in ("decode", "train") for way in ("grouped", "alone")
    }
    with OtherLoad() as load:
        for run in range(runs + 1):  # the first of each: a warm-up
            for way in ("grouped", "alone"):
                for grouping in groupings:
                    grouping.use(way == "grouped")
                with torch.inference_mode():
                    decoded = decode(batch, shape["new_tokens"])
                seconds, _ = step()
                if run:
                    figures[f"decode_{way}"].append(
                        1000 * decoded["decode_s"] / (shape["new_tokens"] - 1)
                    )
                    figures[f"train_{way}"].append(seconds)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    return {
        "dtype": dtype,
        "groups": _groups(groupings[0]),
        "decode_ms_per_step": {
            way: round(medians[f"decode_{way}"], 2) for way in ("grouped", "alone")
        },
        "train_s_per_step": {
            way: round(medians[f"train_{way}"], 3) for way in ("grouped", "alone")
        },
        "runs": {name: [round(v, 4) for v in values] for name, values in figures.items()},
        "decode_grouped_vs_alone": round(medians["decode_grouped"] / medians["decode_alone"], 3),
        "train_grouped_vs_alone": round(medians["train_grouped"] / medians["train_alone"], 3),
        "equal": _equal(decode.engine, groupings[0], batch) and _loss_equal(step, groupings[1]),
        "other_cores": round(load.cores, 2),
    }


def _groups(grouping: Grouping) -> int:
    return len({id(entry[0]) for entry in grouping.entries.values()})


def _trainer(model: Any, tokenizer: Any, shape: dict[str, int]) -> tuple[Any, Any]:
    """A LoRA trainer on `model` (prepared as served) and its step: (seconds, loss)."""
    spec = {
        "groups": shape["groups"],
        "per_group": 4,
        "prompt_tokens": shape["train_prompt"],
        "completion_tokens": 32,
    }
    trainer, rows, loss, settings = grpo_trainer(model, tokenizer, spec)

    def step(optimize: bool = True) -> tuple[float, float]:
        started = time.perf_counter()
        totals = trainer.forward_backward(rows, loss, settings)
        if optimize:
            trainer.optim_step(settings)
        return time.perf_counter() - started, float(totals.loss)

    return trainer, step


def _equal(engine: Any, grouping: Grouping, batch: list[list[int]]) -> bool:
    """Whether both ways give the same logits, bit for bit, on the prompts and on one row."""
    engine.model.set_adapter(engine.adapters["bench@1"])
    ids = torch.tensor(batch)
    logits = {}
    with torch.inference_mode():
        for on in (True, False):
            grouping.use(on)
            logits[on] = [engine.model(input_ids=x).logits for x in (ids, ids[:1, :1])]
    grouping.use(True)
    return all(torch.equal(a, b) for a, b in zip(logits[True], logits[False], strict=True))


def _loss_equal(step: Any, grouping: Grouping) -> bool:
    """Whether the trainer's loss on the rows is the same both ways (no optimizer step between:
    the step's loss sums its forwards, each a float32 value, so the second adds its own exactly)."""
    grouping.use(True)
    grouped = step(optimize=False)[1]
    grouping.use(False)
    both = step(optimize=False)[1]
    grouping.use(True)
    return both - grouped == grouped


def section(result: dict[str, Any]) -> str:
    shape = result["workload"]
    lines = [
        START,
        "## q/k/v and gate/up in one packed call vs one call a layer (`benchmarks/sibling_linear.py`)",
        "",
        f"{result['when'][:10]}, {result['machine']['cpu_model']}, "
        f"{result['machine']['torch_threads']} threads. {result['model']} as served; decode: the "
        f"engine's loop, {shape['rows']} rows x {shape['prompt_tokens']} prompt tokens, "
        f"{shape['new_tokens']} sampled, through a random LoRA (r16) on q, k, v, o; train: "
        f"forward+backward and optimizer step on {shape['groups']} prompts x 4 completions "
        f"of 32 tokens. Both ways in turns in one process, medians of {result['runs']} runs.",
        "",
        "| dtype | groups | decode ms/step, grouped | alone | ratio | train s/step, grouped "
        "| alone | ratio | logits and loss equal | other load (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for figure in result["figures"]:
        decode, train = figure["decode_ms_per_step"], figure["train_s_per_step"]
        lines.append(
            f"| {figure['dtype']} | {figure['groups']} | {decode['grouped']:.1f} "
            f"| {decode['alone']:.1f} | **{figure['decode_grouped_vs_alone']:.3f}x** "
            f"| {train['grouped']:.3f} | {train['alone']:.3f} "
            f"| **{figure['train_grouped_vs_alone']:.3f}x** "
            f"| {'yes' if figure['equal'] else '**no**'} | {figure['other_cores']:.2f} |"
        )
    lines += [
        "",
        "How the grouping works and why its values are each layer's own: docs/performance.md, "
        '"Layers that read one input, in one call".',
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    # bf16 only: float32 layers are not grouped
    return run_in_turns(
        argv, sys.modules[__name__], dtypes="bfloat16", tiny_setup=_pack_every_layer
    )


def _pack_every_layer() -> None:
    """The tiny model's layers are under `MIN_WEIGHT`: packed (and so grouped) only this way."""
    from art_backend.engines import _packed_linear

    _packed_linear.MIN_WEIGHT = {torch.float32: 0, torch.bfloat16: 0}


if __name__ == "__main__":
    main()
