"""LangGraph capture overhead: the same graph, stock `ChatOpenAI` against `art_langgraph`.

One LangGraph graph (planner -> two parallel branches -> final: four LLM calls a run), the same
running `art-server` (a child process on 127.0.0.1, started by `art.LocalBackend`), the same
served weights (the registered model's step 0, `name@0`), greedy, a fixed `max_tokens`:

- A: a stock `langchain_openai.ChatOpenAI` pointed at the server, no capture;
- B: `art_langgraph.TrainableChatModel(model)` inside `async with art_langgraph.rollout(model)`,
  timed until the block has exited (the trajectory is assembled by then: a user pays for that).

Runs are interleaved pair by pair (A B, then B A, ...: drift on the shared machine hits both
alike) and A and B must produce identical texts in every pair, else the comparison is unfair and
the result says so. Reported: medians per graph run and per LLM call, the overhead B/A - 1 and
in milliseconds, the median of the paired differences, and a breakdown of B's extra time
(inside the graph vs assembling the trajectory: GET /v1/rollouts/{id} and parsing).

Two configurations: SmolLM2-135M-Instruct (the target: <= 5% overhead) and the tiny random test
model (`tests/support/tiny_model.py`), where generation is nearly free, so the overhead is most visible.

    .venv/bin/python benchmarks/langgraph_overhead.py [--runs 50] [--only smollm2|tiny]

Writes benchmarks/results/langgraph_overhead.json and its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine_info
from _markdown import publish
from _ours import qkvo_model
from _tiny_model import build_tiny_model

import art_core as art
import art_langgraph
from art_core.model import trajectory_from_records

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "langgraph_overhead.json"
START, END = "<!-- langgraph_overhead:start -->", "<!-- langgraph_overhead:end -->"
OVERHEAD_TARGET = 0.05  # B/A - 1, on the real model
CALLS_PER_RUN = 4
RUN_TIMEOUT = 600.0
MAX_ATTEMPTS = 5  # a pair whose A and B texts differ is run again, up to this often
CONTENDED_CORES = 0.3  # other processes' mean CPU use above which a pair counts as contended

TOPICS = [
    "bees", "rain", "bread", "trains", "the moon", "chess", "tea", "maps", "owls", "glass",
    "rivers", "clocks", "salt", "kites", "snow", "copper", "bridges", "ferns", "jazz", "sand",
    "lamps", "whales", "paper", "wind", "cheese", "stairs", "violins", "deserts", "ink", "ants",
    "harbors", "mirrors", "apples", "storms", "wool", "caves", "bells", "frogs", "ropes", "dust",
    "ovens", "tides", "wheels", "moss", "ladders", "coral", "candles", "hills", "buttons", "fog",
]  # fmt: skip


# ----------------------------------------------------------------------------------- the graph


class State(TypedDict, total=False):
    topic: str
    plan: str
    title: str
    intro: str
    final: str


def build_graph(llm: Any) -> Any:
    """planner -> (title | intro, in parallel) -> final: four LLM calls, each on earlier output."""
    from langgraph.graph import END as GRAPH_END
    from langgraph.graph import START as GRAPH_START
    from langgraph.graph import StateGraph

    async def ask(prompt: str) -> str:
        return str((await llm.ainvoke([("user", prompt)])).content)

    async def planner(state: State) -> State:
        return {"plan": await ask(f"Give two short ideas for a blog post about {state['topic']}.")}

    async def title(state: State) -> State:
        return {"title": await ask(f"Write a title for this blog post idea: {state['plan']}")}

    async def intro(state: State) -> State:
        return {"intro": await ask(f"Write the first sentence of this blog post: {state['plan']}")}

    async def final(state: State) -> State:
        prompt = f"Title: {state['title']}\nFirst sentence: {state['intro']}\nSummarize the post."
        return {"final": await ask(prompt)}

    graph = StateGraph(State)
    graph.add_node("planner", planner)
    graph.add_node("title", title)
    graph.add_node("intro", intro)
    graph.add_node("final", final)
    graph.add_edge(GRAPH_START, "planner")
    graph.add_edge("planner", "title")
    graph.add_edge("planner", "intro")
    graph.add_edge(["title", "intro"], "final")
    graph.add_edge("final", GRAPH_END)
    return graph.compile()


def outputs(state: dict[str, Any]) -> list[str]:
    return [state["plan"], state["title"], state["intro"], state["final"]]


# ------------------------------------------------------------------------------------ the runs


class Variants:
    """A (stock ChatOpenAI, no capture) and B (TrainableChatModel in a rollout), one graph each."""

    def __init__(self, model: art.TrainableModel, max_tokens: int) -> None:
        from langchain_openai import ChatOpenAI

        backend = model.backend
        sampling = {"temperature": 0.0, "max_tokens": max_tokens}
        self.model = model
        self.stock = ChatOpenAI(
            model=model.get_inference_name(),  # the same served weights as B: name@0
            base_url=backend.inference_base_url,
            api_key=backend.api_key or "unused",
            **sampling,
        )
        self.trainable = art_langgraph.TrainableChatModel(model, **sampling)
        self.graph_a = build_graph(self.stock)
        self.graph_b = build_graph(self.trainable)

    async def run_a(self, topic: str) -> dict[str, Any]:
        started = time.perf_counter()
        state = await self.graph_a.ainvoke({"topic": topic})
        return {"seconds": time.perf_counter() - started, "outputs": outputs(state)}

    async def run_b(self, topic: str) -> dict[str, Any]:
        started = time.perf_counter()
        async with art_langgraph.rollout(self.model, scenario=topic) as r:
            state = await self.graph_b.ainvoke({"topic": topic})
            r.reward = 1.0
            graph_done = time.perf_counter()
        ended = time.perf_counter()
        trajectory = r.trajectory
        captured = [h.messages()[-1].get("content") or "" for h in trajectory.histories()]
        return {
            "seconds": ended - started,
            "graph_seconds": graph_done - started,
            "assembly_seconds": ended - graph_done,
            "outputs": outputs(state),
            "captured_calls": len(trajectory.histories()),
            "captured_matches": sorted(captured) == sorted(outputs(state)),
            "rollout_id": r.id,
        }


class LoadMeter:
    """CPU cores used by processes other than this one and the backend's, between two marks."""

    def __init__(self, backend_pid: int | None) -> None:
        self.ours = [psutil.Process()]
        if backend_pid is not None:
            with contextlib.suppress(psutil.Error):
                self.ours.append(psutil.Process(backend_pid))

    def mark(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        busy = sum(getattr(times, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
        ours = 0.0
        for process in self.ours:
            with contextlib.suppress(psutil.Error):
                cpu = process.cpu_times()
                ours += cpu.user + cpu.system + cpu.children_user + cpu.children_system
        return time.perf_counter(), busy, ours

    @staticmethod
    def other_cores(start: tuple[float, float, float], end: tuple[float, float, float]) -> float:
        wall = end[0] - start[0]
        return max(0.0, (end[1] - start[1]) - (end[2] - start[2])) / wall if wall > 0 else 0.0


async def timed(run: Callable[[str], Awaitable[dict[str, Any]]], topic: str) -> dict[str, Any]:
    return await asyncio.wait_for(run(topic), RUN_TIMEOUT)


async def breakdown(variants: Variants, rollout_ids: list[str]) -> dict[str, Any]:
    """Where B's per-run extras go, each piece timed alone (medians, milliseconds)."""
    from langchain_core.messages import HumanMessage

    backend = variants.model.backend
    messages = [HumanMessage("Give two short ideas for a blog post about bees.")]
    payload_ms: dict[str, float] = {}
    for name, llm in (("stock", variants.stock), ("trainable", variants.trainable)):
        repeats = 2000
        started = time.perf_counter()
        for _ in range(repeats):
            llm._get_request_payload(messages)
        payload_ms[name] = (time.perf_counter() - started) / repeats * 1000
    async with art_langgraph.rollout(variants.model):
        started = time.perf_counter()
        for _ in range(2000):
            variants.trainable._get_request_payload(messages)  # with the X-Rollout-Id header
        payload_ms["trainable_in_rollout"] = (time.perf_counter() - started) / 2000 * 1000
    fetch, parse, sizes = [], [], []
    for rollout_id in rollout_ids:
        started = time.perf_counter()
        records = await backend.rollout_records(rollout_id)
        fetch.append(time.perf_counter() - started)
        started = time.perf_counter()
        trajectory_from_records(records, reward=1.0, metrics={}, metadata={})
        parse.append(time.perf_counter() - started)
        sizes.append(len(json.dumps(records)))
    return {
        "request_payload_ms": {k: round(v, 4) for k, v in payload_ms.items()},
        "get_rollout_ms": round(statistics.median(fetch) * 1000, 2),
        "trajectory_from_records_ms": round(statistics.median(parse) * 1000, 2),
        "rollout_json_bytes": int(statistics.median(sizes)),
    }


async def measure(config: str, base_model: str, runs: int, warmup: int, max_tokens: int) -> dict:
    """Start the backend for `base_model`, run A and B interleaved, and always stop it."""
    with tempfile.TemporaryDirectory(prefix=f"langgraph-overhead-{config}-") as work:
        backend = art.LocalBackend(path=Path(work) / "art")
        model = art.TrainableModel(
            name=f"langgraph-overhead-{config}",
            project="bench",
            base_model=base_model,
            lora=qkvo_model("lora").lora_config,  # the adapter every benchmark serves and trains
        )
        try:
            started = time.perf_counter()
            await model.register(backend)
            print(f"== {config}: backend up in {time.perf_counter() - started:.1f} s", flush=True)
            variants = Variants(model, max_tokens)
            for k in range(warmup):
                await timed(variants.run_a, TOPICS[k % len(TOPICS)])
                await timed(variants.run_b, TOPICS[k % len(TOPICS)])
            meter = LoadMeter(backend.process.pid if backend.process else None)
            pairs, mismatches = [], []
            for k in range(runs):
                topic = TOPICS[k % len(TOPICS)]
                attempt = 0
                while attempt < MAX_ATTEMPTS:
                    attempt += 1
                    mark = meter.mark()
                    if k % 2 == 0:
                        a = await timed(variants.run_a, topic)
                        b = await timed(variants.run_b, topic)
                    else:
                        b = await timed(variants.run_b, topic)
                        a = await timed(variants.run_a, topic)
                    load = LoadMeter.other_cores(mark, meter.mark())
                    same = a["outputs"] == b["outputs"]
                    print(
                        f"   {k + 1:>3}/{runs} A {a['seconds'] * 1000:8.1f} ms  "
                        f"B {b['seconds'] * 1000:8.1f} ms  same={same}  load {load:.2f}",
                        flush=True,
                    )
                    if attempt > 1:
                        # Did A or B itself give other texts on the re-run? Then the difference
                        # is the server's run-to-run variation, not the client's doing.
                        earlier = mismatches[-1]
                        earlier["a_changed_on_next_run"] = earlier["a"] != a["outputs"]
                        earlier["b_changed_on_next_run"] = earlier["b"] != b["outputs"]
                    if same:
                        break
                    mismatches.append({"topic": topic, "a": a["outputs"], "b": b["outputs"]})
                pairs.append(
                    {"topic": topic, "a": a, "b": b, "other_load_cores": load, "attempts": attempt}
                )
            parts = await breakdown(variants, [p["b"]["rollout_id"] for p in pairs[:20]])
        finally:
            await backend.close()
    return summarize(config, base_model, warmup, max_tokens, pairs, mismatches, parts)


def bootstrap_overhead(a: list[float], b: list[float], resamples: int = 2000) -> list[float]:
    """95% interval of median(B) / median(A) - 1, resampling whole pairs (seeded)."""
    rng = random.Random(0)
    indices = range(len(a))
    values = []
    for _ in range(resamples):
        sample = rng.choices(indices, k=len(a))
        values.append(
            statistics.median(b[i] for i in sample) / statistics.median(a[i] for i in sample) - 1
        )
    low, high = statistics.quantiles(values, n=40)[0], statistics.quantiles(values, n=40)[-1]
    return [round(low, 4), round(high, 4)]


def summarize(
    config: str,
    base_model: str,
    warmup: int,
    max_tokens: int,
    all_pairs: list[dict[str, Any]],
    mismatches: list[dict[str, Any]],
    parts: dict[str, Any],
) -> dict[str, Any]:
    """Medians over the pairs whose A and B texts are identical (the others are counted)."""

    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 2)

    pairs = [p for p in all_pairs if p["a"]["outputs"] == p["b"]["outputs"]]
    runs = len(pairs)

    a = [p["a"]["seconds"] for p in pairs]
    b = [p["b"]["seconds"] for p in pairs]
    diffs = sorted(p["b"]["seconds"] - p["a"]["seconds"] for p in pairs)
    quartiles = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
    median_a, median_b = statistics.median(a), statistics.median(b)
    return {
        "config": config,
        "base_model": base_model,
        "runs": runs,
        "warmup_runs_each": warmup,
        "max_tokens": max_tokens,
        "calls_per_run": CALLS_PER_RUN,
        "median_a_ms": ms(a),
        "median_b_ms": ms(b),
        "median_a_ms_per_call": round(median_a * 1000 / CALLS_PER_RUN, 2),
        "median_b_ms_per_call": round(median_b * 1000 / CALLS_PER_RUN, 2),
        "overhead_fraction": round(median_b / median_a - 1, 4),
        "overhead_fraction_ci95": bootstrap_overhead(a, b),
        "overhead_ms_per_run": round((median_b - median_a) * 1000, 2),
        "overhead_ms_per_call": round((median_b - median_a) * 1000 / CALLS_PER_RUN, 2),
        "paired_difference_ms": {
            "median": round(quartiles[1] * 1000, 2),
            "p25": round(quartiles[0] * 1000, 2),
            "p75": round(quartiles[2] * 1000, 2),
        },
        "b_graph_ms": ms([p["b"]["graph_seconds"] for p in pairs]),
        "b_assembly_ms": ms([p["b"]["assembly_seconds"] for p in pairs]),
        "pairs_requested": len(all_pairs),
        "identical_outputs": runs,
        "pairs_rerun": sum(p["attempts"] > 1 for p in all_pairs),
        "mismatches": mismatches,
        "captured_all_calls": all(
            p["b"]["captured_calls"] == CALLS_PER_RUN and p["b"]["captured_matches"] for p in pairs
        ),
        "mean_completion_chars": round(
            statistics.mean(len(t) for p in pairs for t in p["a"]["outputs"]), 1
        ),
        "other_load_cores_median": round(
            statistics.median(p["other_load_cores"] for p in pairs), 2
        ),
        "contended_pairs": sum(p["other_load_cores"] > CONTENDED_CORES for p in pairs),
        "breakdown": parts,
        "target_met": median_b / median_a - 1 <= OVERHEAD_TARGET,
        "pairs": [
            {
                "topic": p["topic"],
                "a_ms": round(p["a"]["seconds"] * 1000, 2),
                "b_ms": round(p["b"]["seconds"] * 1000, 2),
                "b_assembly_ms": round(p["b"]["assembly_seconds"] * 1000, 2),
                "attempts": p["attempts"],
                "other_load_cores": round(p["other_load_cores"], 2),
            }
            for p in all_pairs
        ],
        "example_outputs": pairs[0]["a"]["outputs"],
    }


# -------------------------------------------------------------------------------------- report


LABELS = {
    "smollm2": "SmolLM2-135M-Instruct",
    "tiny": "tiny random model (worst case)",
}


def markdown(report: dict[str, Any]) -> str:
    machine, configs = report["machine"], report["configs"]
    lines = [
        START,
        "## LangGraph capture overhead: stock ChatOpenAI vs art_langgraph "
        "(`benchmarks/langgraph_overhead.py`)",
        "",
        "One graph (planner -> two parallel branches -> final: 4 LLM calls a run), one "
        "`art-server` child process on 127.0.0.1, the same served weights (`name@0`), greedy, "
        "fixed `max_tokens`. A: stock `langchain_openai.ChatOpenAI` pointed at the server, no "
        "capture. B: `art_langgraph.TrainableChatModel` inside `async with "
        "art_langgraph.rollout(model)`, timed until the block exits (trajectory assembled). "
        "Runs interleaved pair by pair (AB, BA, ...), medians. "
        f"Server on {machine['server_threads']} torch thread(s). "
        f"Measured {machine['date']} on {machine['cpu_count']} x {machine['cpu_model']}, "
        f"langgraph {machine['langgraph']}, langchain-openai {machine['langchain-openai']}.",
        "",
        "| model | max_tokens | runs | A per run (ms) | B per run (ms) | A per LLM call (ms) "
        "| B per LLM call (ms) | overhead [95% interval] | overhead per run (ms) | overhead per LLM call (ms) "
        "| identical outputs | target <= 5% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for key, c in configs.items():
        low, high = c["overhead_fraction_ci95"]
        lines.append(
            f"| {LABELS.get(key, key)} | {c['max_tokens']} | {c['runs']} | {c['median_a_ms']:.1f} "
            f"| {c['median_b_ms']:.1f} | {c['median_a_ms_per_call']:.1f} "
            f"| {c['median_b_ms_per_call']:.1f} | **{c['overhead_fraction'] * 100:+.1f}%** "
            f"[{low * 100:+.1f}, {high * 100:+.1f}] "
            f"| {c['overhead_ms_per_run']:+.1f} | {c['overhead_ms_per_call']:+.2f} "
            f"| {c['identical_outputs']}/{c['pairs_requested']} ({c['pairs_rerun']} re-run) | {'yes' if c['target_met'] else 'no'} |"
        )
    lines += [
        "",
        "| model | paired B - A per run (ms): median [p25, p75] | B: graph (ms) | B: trajectory "
        "assembly (ms) | of which GET /v1/rollouts/{id} (ms) | parse (ms) | rollout JSON (bytes) "
        "| other load (cores) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, c in configs.items():
        d, parts = c["paired_difference_ms"], c["breakdown"]
        lines.append(
            f"| {LABELS.get(key, key)} | {d['median']:+.1f} [{d['p25']:+.1f}, {d['p75']:+.1f}] "
            f"| {c['b_graph_ms']:.1f} | {c['b_assembly_ms']:.1f} | {parts['get_rollout_ms']:.1f} "
            f"| {parts['trajectory_from_records_ms']:.2f} | {parts['rollout_json_bytes']:,} "
            f"| {c['other_load_cores_median']:.2f} |"
        )
    lines += [
        "",
        "Overhead = median(B) / median(A) - 1, with a 95% bootstrap interval (pairs "
        "resampled); per LLM call = per run / 4 (the one trajectory "
        "assembly a run included). Identical outputs: the four texts of A and B agree in every "
        "pair (same tokens, so the same work on the server). The GET and parse columns time "
        "those two steps alone, on 20 of the recorded rollouts. Other load: median CPU cores used "
        "by processes outside the benchmark during a pair (the machine is shared, 2 cores). "
        "Raw numbers: `benchmarks/results/langgraph_overhead.json`.",
        "",
        *notes(report),
        END,
    ]
    return "\n".join(lines)


NODES = ["planner", "title (branch)", "intro (branch)", "final"]


def notes(report: dict[str, Any]) -> list[str]:
    """The reading of the numbers, from the numbers."""
    configs = report["configs"]
    out = []
    for key, c in configs.items():
        payload = c["breakdown"]["request_payload_ms"]
        out.append(
            f"- {LABELS.get(key, key)}: B inside the graph {c['b_graph_ms']:.1f} ms against A's "
            f"{c['median_a_ms']:.1f} ms; B's trajectory assembly at the end of the rollout "
            f"{c['b_assembly_ms']:.1f} ms a run. Building one request costs "
            f"{payload['stock'] * 1000:.0f} us (stock) and {payload['trainable_in_rollout'] * 1000:.0f}"
            " us (trainable, with the rollout header)."
            + (
                " The paired differences' quartiles span zero: the overhead is below this "
                "machine's run-to-run noise here."
                if c["paired_difference_ms"]["p25"] < 0 < c["paired_difference_ms"]["p75"]
                else ""
            )
        )
    out.append(
        f"- The server runs on {report['machine']['server_threads']} torch thread(s) "
        "(`--server-threads`): on this shared 2-core machine a 2-thread engine waits on its "
        "other thread whenever a foreign process runs (in a trial here, SmolLM2 runs took 5-38 s "
        "with torch's default 2 threads against ~2 s with one); one thread keeps the server's "
        "time stable. Both variants use the same "
        "server, so the comparison is unaffected."
    )
    for key, c in configs.items():
        if not c["mismatches"]:
            continue
        changed = [
            m
            for m in c["mismatches"]
            if m.get("a_changed_on_next_run") or m.get("b_changed_on_next_run")
        ]
        where = collections.Counter(
            NODES[next(i for i, (x, y) in enumerate(zip(m["a"], m["b"], strict=True)) if x != y)]
            for m in c["mismatches"]
        )
        out.append(
            f"- {LABELS.get(key, key)}: {len(c['mismatches'])} run(s) of a pair gave different "
            f"texts for A and B ({c['pairs_rerun']} pair(s) run again; first difference in "
            + ", ".join(f"{node} {count}x" for node, count in where.most_common())
            + f"); on the next run, A or B itself changed its text {len(changed)} time(s): the "
            "server's greedy text is not bit-stable across identical runs: a request that joins "
            "the batch while another decodes (the two branches) is computed left-padded, and a "
            "near-tie token can flip. Only identical pairs are in the medians."
        )
    if "tiny" in configs:
        out.append(
            "- The tiny random model answers 16 newlines to every prompt, so its equality check "
            "is trivial; it stands for a model whose generation is nearly free, where the "
            "client's and HTTP's share of the time is largest."
        )
    loads = [c["other_load_cores_median"] for c in configs.values()]
    out.append(
        f"- Other processes used {min(loads):.1f}-{max(loads):.1f} cores throughout (the "
        "machine is shared); both variants ran under it alike, interleaved pair by pair."
    )
    return out


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    configs: dict[str, Any] = {}
    if args.only in (None, "smollm2"):
        configs["smollm2"] = await measure(
            "smollm2", "smollm2-135m-instruct", args.runs, args.warmup, args.max_tokens
        )
    if args.only in (None, "tiny"):
        with tempfile.TemporaryDirectory(prefix="langgraph-overhead-tiny-model-") as folder:
            tiny = build_tiny_model(Path(folder))
            configs["tiny"] = await measure(
                "tiny", str(tiny), args.tiny_runs, args.warmup, args.max_tokens
            )
            configs["tiny"]["base_model"] = (
                "tests/support/tiny_model.py (built in a temporary folder)"
            )
    return {
        "benchmark": "langgraph_overhead",
        "machine": machine_info(
            "langgraph", "langchain-core", "langchain-openai", "openai", "httpx"
        ),
        "configs": configs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="interleaved pairs per model")
    parser.add_argument(
        "--tiny-runs", type=int, default=200, help="pairs on the tiny model (cheap, and noisier)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs of each first")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--server-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of the server (0: torch's default). On 2 shared cores, a 2-thread "
        "engine waits on its other thread whenever a foreign process runs (10x slower, erratic); "
        "one thread keeps the server's time stable and leaves a core to the client",
    )
    parser.add_argument("--only", choices=["smollm2", "tiny"], help="one model; writes nothing")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.server_threads:
        os.environ["OMP_NUM_THREADS"] = str(args.server_threads)  # LocalBackend's child inherits
    report = asyncio.run(run_all(args))
    report["machine"]["server_threads"] = args.server_threads or "torch default"
    if args.only:
        print(markdown(report))
        return
    publish(report, RESULTS, START, END, markdown(report))


if __name__ == "__main__":
    main()
