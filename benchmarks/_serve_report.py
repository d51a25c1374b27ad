"""The serving benchmark's report: ratios against the targets and its BENCHMARKS.md sections."""

from __future__ import annotations

from typing import Any

from _serve_settings import (
    ADAPTER_ALPHA,
    ADAPTER_B_STD,
    ADAPTER_RANK,
    ADAPTER_TARGETS,
    BENCHMARKS_MD,
    CONTENDED_CORES,
    DEFAULT_DTYPE,
    RSS_TARGET_MB,
    SECTION_END,
    SECTION_START,
    VLLM_KV_CACHE_GB,
    VLLM_MAX_MODEL_LEN,
    section_markers,
)

# Each ratio: (our contender, the peer, the target; None where only reported).
RATIOS: dict[str, tuple[str, str, float | None]] = {
    "ours_vs_transformers_serve": ("ours", "transformers_serve", 3.0),
    "ours_vs_transformers_serve_cb": ("ours", "transformers_serve_cb", 1.2),
    "ours_vs_offline_generate": ("ours", "offline_generate", 0.8),
    "ours_vllm_vs_vllm": ("ours_vllm", "vllm", 0.9),
    "ours_vllm_lora_vs_vllm_lora": ("ours_vllm_lora", "vllm_lora", 0.9),
    "ours_lora_vs_vllm_lora": ("ours_lora", "vllm_lora", 1.0),
    "ours_vs_vllm": ("ours", "vllm", None),
    "ours_vs_ours_vllm": ("ours", "ours_vllm", None),
}
TARGETS = {key: target for key, (_, _, target) in RATIOS.items() if target is not None}


def ratios(contenders: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every ratio one of whose contenders ran, and our peak RSS; a side not measured is noted."""
    out: dict[str, Any] = {}
    for key, (ours_key, peer_key, target) in RATIOS.items():
        if ours_key not in contenders and peer_key not in contenders:
            continue
        ours, peer = contenders.get(ours_key, {}), contenders.get(peer_key, {})
        entry: dict[str, Any] = {"ratio": None, "target": target}
        ratio = None
        if ours.get("ok") and peer.get("ok") and peer["median_tokens_per_second"]:
            ratio = ours["median_tokens_per_second"] / peer["median_tokens_per_second"]
            entry["ratio"] = round(ratio, 3)
        else:
            entry["note"] = "not measured"
        if target is not None:
            entry["met"] = ratio is not None and ratio >= target  # unrounded: 0.997 misses 1.0
        out[key] = entry
    if "ours" in contenders:
        ours = contenders["ours"]
        rss = ours.get("peak_rss_mb")
        out["ours_peak_rss_mb"] = {
            "value": rss,
            "target": f"<= {RSS_TARGET_MB:.0f}",
            "met": bool(ours.get("ok") and rss is not None and rss <= RSS_TARGET_MB),
        }
    return out


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_section(report: dict[str, Any]) -> str:
    machine, work, contenders, rat = (
        report["machine"],
        report["workload"],
        report["contenders"],
        report["ratios"],
    )
    flags = "" if machine["dtype"] == DEFAULT_DTYPE else f" --dtype {machine['dtype']}"
    flags += f" --busy {work['busy_processes']}" if work.get("busy_processes") else ""
    lines = [
        SECTION_START,
        f"## Serving throughput, {machine['dtype']} (`benchmarks/serve_throughput.py{flags}`)",
        "",
        f'{work["requests"]} concurrent chat requests (different "Write a long story about ..." '
        f"prompts), max {work['max_tokens']} new tokens, temperature 0, model "
        f"{work['model']} in {machine['dtype']} for every contender; median of {work['runs']} "
        f"runs after one warm-up request. Measured {machine['date']} on {machine['cpu_count']} x "
        f"{machine['cpu_model']} (native bf16: {machine['native_bf16']}), torch "
        f"{machine['torch']}, transformers {machine['transformers']}.",
        "",
        "| contender | tok/s (median) | runs | mean tokens/request | TTFT (s) | single-request tok/s "
        "| peak RSS (MB) | other load (cores) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    labels = {
        "ours": "ours (`art-server`)",
        "transformers_serve": "`transformers serve`",
        "transformers_serve_cb": "`transformers serve --continuous-batching`",
        "offline_generate": "offline batched `generate()`",
    }
    for key, label in labels.items():
        c = contenders.get(key)
        if c is None:
            continue
        if not c.get("ok"):
            lines.append(f"| {label} | failed: {c.get('error', '?')[:80]} | | | | | | |")
            continue
        runs = ", ".join(
            f"{r['tokens_per_second']:.1f}{'*' if r.get('contended') else ''}" for r in c["runs"]
        )
        lines.append(
            f"| {label} | {_fmt(c['median_tokens_per_second'])} | {runs} | "
            f"{_fmt(c['mean_tokens_per_request'])} | {_fmt(c.get('ttft_seconds'), 2)} | "
            f"{_fmt(c.get('single_tokens_per_second'))} | {_fmt(c.get('peak_rss_mb'), 0)} | "
            f"{_fmt(c.get('other_load_cores'), 2)} |"
        )
    lines += ["", "| target | measured | met |", "|---|---:|---|"]
    names = {
        "ours_vs_transformers_serve": "ours / `transformers serve` >= 3x",
        "ours_vs_transformers_serve_cb": "ours / `transformers serve --continuous-batching` >= 1.2x",
        "ours_vs_offline_generate": "ours / offline batched `generate()` >= 0.8x",
    }
    for key, label in names.items():
        entry = rat.get(key, {"ratio": None, "met": False})
        ratio = entry["ratio"]
        lines.append(
            f"| {label} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{'yes' if entry['met'] else 'no'} |"
        )
    rss = rat.get("ours_peak_rss_mb", {"value": None, "met": False})
    lines.append(
        f"| ours peak RSS <= {RSS_TARGET_MB:.0f} MB | {_fmt(rss['value'], 0)} MB | "
        f"{'yes' if rss['met'] else 'no'} |"
    )
    lines += [
        "",
        "TTFT and single-request tok/s: one streamed request of the same length, alone on the "
        "server (median of the runs). Peak RSS: the server's process tree over its whole life "
        "(loading included), sampled every 50 ms. Lengths are not forced (no server here accepts "
        "a minimum-tokens field): tokens/s counts the completion tokens each server reports in "
        "`usage`, so compare the mean tokens per request column. Other load: mean CPU cores "
        "used by processes outside the benchmark during the timed runs (the machine is shared; "
        "2 cores in all); a run is repeated (`--retries`, default 2) while that exceeds "
        f"{CONTENDED_CORES} cores, and `*` marks a run kept although contended. Raw numbers: "
        f"`benchmarks/results/{report['results_file']}`.",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


ENGINE_LABELS = {
    "ours": ("ours, torch engine (`art-server`)", "base"),
    "ours_lora": ("ours, torch engine (`art-server`)", "adapter"),
    "ours_vllm": ("ours, vLLM engine (`art-server --engine vllm`)", "base"),
    "ours_vllm_lora": ("ours, vLLM engine (`art-server --engine vllm`)", "adapter"),
    "vllm": ("raw vLLM (`vllm.entrypoints.openai.api_server`)", "base"),
    "vllm_lora": ("raw vLLM (`vllm.entrypoints.openai.api_server`)", "adapter"),
}
ENGINE_RATIO_LABELS = {
    "ours_vllm_vs_vllm": "ours on vLLM / raw vLLM, base model >= 0.9x",
    "ours_vllm_lora_vs_vllm_lora": "ours on vLLM / raw vLLM, adapter >= 0.9x",
    "ours_lora_vs_vllm_lora": "ours on torch / raw vLLM, adapter >= 1.0x",
    "ours_vs_vllm": "ours on torch / raw vLLM, base model (reported)",
    "ours_vs_ours_vllm": "ours on torch / ours on vLLM, base model (reported)",
}


def _condition(report: dict[str, Any]) -> str:
    busy = report["workload"].get("busy_processes", 0)
    if not busy:
        return "quiet machine"
    return "one busy process (`--busy 1`)" if busy == 1 else f"{busy} busy processes"


def engines_section(quiet: dict[str, Any] | None, busy: dict[str, Any] | None) -> str:
    """The engine comparison: one table per condition (quiet, busy), then the ratios of both."""
    start, end = section_markers("_engines")
    reports = [r for r in (quiet, busy) if r is not None]
    first = reports[0]
    machine, work = first["machine"], first["workload"]
    lines = [
        start,
        "## Serving engines: torch vs vLLM on this CPU "
        "(`benchmarks/serve_throughput.py --only ours,ours_vllm,vllm --lora`)",
        "",
        f"{work['requests']} concurrent chat requests x max {work['max_tokens']} new tokens, "
        f"temperature 0, {work['model']} in {machine['dtype']}, addressed to the base model and "
        f"then, on the same server start, to a LoRA adapter (r {ADAPTER_RANK}, alpha "
        f"{ADAPTER_ALPHA}, {', '.join(ADAPTER_TARGETS)}; random, B ~ N(0, {ADAPTER_B_STD}), "
        f"loaded at run time); median of {work['runs']} runs after one warm-up request. "
        f"{machine['cpu_count']} x {machine['cpu_model']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}, {machine.get('vllm') or 'vLLM'} (its own venv).",
    ]
    for report in reports:
        contenders = report["contenders"]
        lines += [
            "",
            f"### {_condition(report)[0].upper()}{_condition(report)[1:]}, measured "
            f"{report['machine']['date']}",
            "",
            "| contender | model | tok/s (median) | runs | mean tokens/request | TTFT (s) "
            "| single-request tok/s | start-up (s) | adapter load (s) | peak RSS (MB) "
            "| other load (cores) |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for key, (label, served) in ENGINE_LABELS.items():
            c = contenders.get(key)
            if c is None:
                continue
            if not c.get("ok"):
                error = " ".join(c.get("error", "?").split())[:80]
                lines.append(f"| {label} | {served} | failed: {error} | | | | | | | | |")
                continue
            runs = ", ".join(
                f"{r['tokens_per_second']:.1f}{'*' if r.get('contended') else ''}"
                for r in c["runs"]
            )
            lines.append(
                f"| {label} | {served} | {_fmt(c['median_tokens_per_second'])} | {runs} | "
                f"{_fmt(c['mean_tokens_per_request'])} | {_fmt(c.get('ttft_seconds'), 2)} | "
                f"{_fmt(c.get('single_tokens_per_second'))} | {_fmt(c.get('startup_seconds'))} | "
                f"{_fmt(c.get('adapter_load_seconds'), 2)} | {_fmt(c.get('peak_rss_mb'), 0)} | "
                f"{_fmt(c.get('other_load_cores'), 2)} |"
            )
    header = " | ".join(_condition(r) for r in reports)
    lines += [
        "",
        f"| ratio (target) | {header} | met |",
        "|---|" + "---:|" * len(reports) + "---|",
    ]
    for key, label in ENGINE_RATIO_LABELS.items():
        entries = [r["ratios"].get(key) for r in reports]
        if all(entry is None for entry in entries):
            continue
        cells = [
            "-" if entry is None or entry["ratio"] is None else f"{entry['ratio']:.3f}x"
            for entry in entries
        ]
        if RATIOS[key][2] is None:
            met = "-"
        else:
            met = " / ".join("yes" if entry and entry.get("met") else "no" for entry in entries)
        lines.append(f"| {label} | {' | '.join(cells)} | {met} |")
    files = ", ".join(f"`benchmarks/results/{r['results_file']}`" for r in reports)
    lines += [
        "",
        "Start-up: from launch to a healthy `/health` (ours on vLLM: our model load plus the vLLM "
        "child's start). Peak RSS: the server's whole process tree (ours on vLLM: our server, "
        "which keeps the trainer's copy of the weights, plus vLLM and its engine process), over "
        "its life. TTFT and single-request tok/s: one streamed request alone on the server. "
        "Other load: mean CPU cores used outside the benchmark during the timed runs (2 cores in "
        "all); in the busy table that is the `while True: pass` process started for each timed "
        "run and stopped after it (a run is repeated only when foreign load exceeds the busy "
        f"processes plus {CONTENDED_CORES} cores; `*` marks a run kept although contended). "
        "Raw vLLM runs as `python -m vllm.entrypoints.openai.api_server --dtype "
        f"{machine['dtype']} --max-model-len {VLLM_MAX_MODEL_LEN} --enable-lora --max-lora-rank "
        f"{ADAPTER_RANK} --max-loras 4` with VLLM_CPU_KVCACHE_SPACE={VLLM_KV_CACHE_GB}; the "
        f"adapter is loaded with `POST /v1/load_lora_adapter` (ours: `POST /v1/adapters`). Raw "
        f"numbers: {files}.",
        end,
    ]
    return "\n".join(lines) + "\n"


INTRO = """# Benchmarks

Speed is measured here, not timed in tests. Each script in `benchmarks/` runs our side and the
peer side by side in one invocation, writes the raw numbers and ratios to
`benchmarks/results/*.json`, and regenerates its section of this file.

Run them with `make bench`. The numbers below come from a shared, noisy 2-core machine without a
GPU: they are medians of several runs, and the ratios (measured in the same run) matter more than
the absolute tokens/s.

"""


def write_markdown(section: str, suffix: str) -> None:
    start, end = section_markers(suffix)
    section = section.replace(SECTION_START, start).replace(SECTION_END, end)
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else INTRO
    if start in text and end in text:
        before = text.split(start, 1)[0]
        after = text.split(end, 1)[1].lstrip("\n")
        text = before + section + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    BENCHMARKS_MD.write_text(text)
