"""The BENCHMARKS.md section of `machine_limit.py`: the peak, each figure's share of it, the
profile's buckets."""

from __future__ import annotations

from typing import Any

BUCKET_NAMES = {
    "matmul": "matmuls (base weights, LM head)",
    "attention": "attention (SDPA kernels)",
    "lora": "LoRA (A and B matmuls, fwd+bwd)",
    "sampling": "sampling (`_draw`: softmax, penalties, draw, host copy)",
    "rows": "rows on the host (text, stops)",
    "loss": "logprobs and loss (fwd+bwd)",
    "optimizer": "optimizer (clip, AdamW)",
    "copies": "copies and allocation (cat, index, copy_, to)",
    "views": "views (reshape, slice, transpose: dispatch only)",
    "elementwise": "elementwise (norms, RoPE, SiLU, masks, embedding)",
    "python": "Python outside any op",
}


def _giga(value: float) -> str:
    return f"{value / 1e9:.1f}"


def _percent(value: float) -> str:
    return f"{100 * value:.0f} %"


def _load(figure: dict[str, Any]) -> str:
    return f"{figure['loadavg_before'][0]:.2f} / {figure['loadavg_after'][0]:.2f}"


def decode_table(result: dict[str, Any]) -> list[str]:
    """One line per decode figure: tokens/s, both FLOP counts and their shares of the peak."""
    lines = [
        "| decode | dtype | rows | tok/s | GFLOP/s (2N) | % of peak | GFLOP/s counted "
        "| % of peak | ms a step | linear floor ms | floor / step "
        "| load avg before / after | other cores |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for figure in result["decode"]:
        contender = "ours" if figure["contender"] == "ours" else "bare HF loop"
        if figure.get("adapter"):
            contender += " + LoRA"
        lines.append(
            f"| {contender} | {figure['dtype']} | {figure['rows']} | "
            f"{figure['decode_tokens_per_s']:.0f} | {_giga(figure['conventional_flops_per_s'])} | "
            f"{_percent(figure['conventional_share_of_peak'])} | "
            f"{_giga(figure['counted_flops_per_s'])} | "
            f"{_percent(figure['counted_share_of_peak'])} | {_floor_columns(figure)} | "
            f"{_load(figure)} | {figure['other_cores']} |"
        )
    return lines


def _floor_columns(figure: dict[str, Any]) -> str:
    if "linear_floor_s" not in figure:  # a result from before the floor was measured
        return "- | - | -"
    return (
        f"{1000 * figure['step_s']:.1f} | {1000 * figure['linear_floor_s']:.1f} | "
        f"{_percent(figure['share_of_linear_floor'])}"
    )


def floor_table(result: dict[str, Any]) -> list[str]:
    """One line per linear floor: a decode step's linear layers alone."""
    if "linear_floor" not in result:
        return []
    lines = [
        "| linear floor | rows | ms a pass | GFLOP/s | % of peak | weights GB/s | "
        "load avg before / after |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for floor in result["linear_floor"]:
        lines.append(
            f"| {floor['dtype']}, {floor.get('kernel', 'dense')} | {floor['rows']} | "
            f"{1000 * floor['step_s']:.1f} | "
            f"{_giga(floor['flops_per_s'])} | {_percent(floor['share_of_peak'])} | "
            f"{floor['weight_bytes_per_s'] / 1e9:.1f} | {_load(floor)} |"
        )
    return [*lines, ""]


def train_table(result: dict[str, Any]) -> list[str]:
    """One line per training figure."""
    lines = [
        "| forward+backward | processed tok | fwd+bwd s | tok/s | GFLOP/s (6N) | % of peak "
        "| GFLOP/s counted | % of peak | optim_step s | load avg before / after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for figure in result["train"]:
        lines.append(
            f"| {figure['dtype']} | {figure['processed_tokens']} | "
            f"{min(figure['forward_backward_s_runs']):.3f} | "
            f"{figure['processed_tokens_per_s']:.0f} | "
            f"{_giga(figure['conventional_flops_per_s'])} | "
            f"{_percent(figure['conventional_share_of_peak'])} | "
            f"{_giga(figure['counted_flops_per_s'])} | "
            f"{_percent(figure['counted_share_of_peak'])} | {figure['optim_step_s']:.3f} | "
            f"{_load(figure)} |"
        )
    return lines


def profile_table(result: dict[str, Any]) -> list[str]:
    """Each bucket's share of the profiled wall time, one column per profile."""
    profiles = result["profiles"]
    names = {"decode": "decode step", "decode_lora": "decode step + LoRA", "train": "train step"}
    shown = [key for key in names if key in profiles]
    lines = [
        "| where the time goes (self CPU) | " + " | ".join(names[k] for k in shown) + " |",
        "|---|" + "---:|" * len(shown),
        "| wall time per step (ms, profiled) | "
        + " | ".join(f"{1000 * profiles[k]['wall_s_per_step']:.1f}" for k in shown)
        + " |",
    ]
    for bucket, label in BUCKET_NAMES.items():
        shares = [profiles[k]["buckets"][bucket]["share"] for k in shown]
        if any(shares):
            lines.append(f"| {label} | " + " | ".join(_percent(s) for s in shares) + " |")
    return lines


def section(result: dict[str, Any], start: str, end: str) -> str:
    """The whole section, between its markers."""
    machine = result["machine"]
    peak = result["matmul_peak"]
    workload = result["workload"]
    lines = [
        start,
        "## The machine's limit: decode and training as a share of the matmul peak "
        "(`benchmarks/machine_limit.py`)",
        "",
        f"Measured {machine['date']} on {machine['cpu_count']} cores ({machine['cpu_model']}), "
        f"torch {machine['torch']} on {machine['torch_threads']} thread(s), every figure in a "
        f"process of its own, best of {result['repeats']} runs. The peak: torch.mm of two "
        f"{peak['float32']['size']}-square matrices, best of 10, measured at the start and the "
        f"end of the run: **{_giga(peak['float32']['flops_per_s'])} GFLOP/s float32, "
        f"{_giga(peak['bfloat16']['flops_per_s'])} GFLOP/s bf16** (the better pass). Decode: "
        f"SmolLM2-135M-Instruct, {workload['prompt_tokens']}-token prompts, "
        f"{workload['new_tokens']} tokens a row (the first drawn after the prefill; the table "
        "times the decode steps only), temperature 1, seeded rows; ours is the engine's decode "
        "loop, the bare loop a transformers forward over its DynamicCache with an argmax. "
        f"Training: {workload['groups']} prompts x {workload['per_group']} completions, "
        f"{workload['prompt_tokens']} + {workload['completion_tokens']} tokens, packed as the "
        "trainer packs them (each prompt once), LoRA r16 on q,k,v,o, GRPO loss.",
        "",
        "*2N / 6N*: 2 x N FLOPs per decoded token, 6 x N per processed training token, N = "
        f"{result['decode'][0]['linear_parameters'] / 1e6:.1f} M linear weights (the tied LM "
        "head once), attention not counted. *Counted*: what torch's FlopCounterMode saw the step "
        "run: every matmul (LoRA's; the frozen weights' backward computes no weight gradient, "
        "so training is below 6N), attention over every cache column. Load: `os.getloadavg()` "
        "(1 min) before and after each figure, and the cores other processes used during it; "
        "the machine is shared.",
        "",
        "*Linear floor*: the model's linear layers alone at the decode step's rows, each weight "
        "read once a pass as a step reads it, on random inputs, with torch's dense kernels "
        "(`nn.functional.linear`: MKL's sgemm in float32) and with oneDNN's on weights packed "
        "once (`packed`, what the engine runs): at a few rows a weight serves few FLOPs, so "
        "this floor sits far below the large-matrix peak, and a decode step cannot go under it "
        "with these kernels. *floor / step*: how much of a decode step the packed linear "
        "layers alone would take.",
        "",
        *floor_table(result),
        *decode_table(result),
        "",
        *train_table(result),
        "",
        "Where the time goes: torch.profiler over "
        f"{result['profiles']['decode']['steps']} decode steps ({workload['rows'][0]} rows, "
        f"float32, mid-run) and "
        f"{result['profiles']['train']['steps']} training steps (float32); each op's self CPU "
        "time, grouped by name, or by the scope it ran in (sampling, rows, LoRA's modules, the "
        "loss, the optimizer; a backward op goes with its forward op's scope). The profiler "
        "adds its own cost to the Python share; the top 20 ops are in the JSON.",
        "",
        *profile_table(result),
        end,
    ]
    return "\n".join(lines)
