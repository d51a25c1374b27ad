"""The report of `mcp_rollouts.py`: its BENCHMARKS.md section and the notes read from the numbers."""

from __future__ import annotations

import statistics
from typing import Any

START, END = "<!-- mcp_rollouts:start -->", "<!-- mcp_rollouts:end -->"
OVERHEAD_TARGET = 0.10  # our overhead as a share of the rollout time


LABELS = {
    "stdio-new": "stdio, new session per rollout",
    "stdio-pool4": "stdio, pool of 4",
    "stdio-pool16": "stdio, pool of 16",
    "http-new": "HTTP, new session per rollout",
    "http-pool4": "HTTP, pool of 4",
    "http-pool16": "HTTP, pool of 16",
}


def run_labels(delay: float, per_run: int) -> dict[str, str]:
    """Each kind of run by its name in the results."""
    return {
        "instant-x1": "instant, 1 at a time",
        f"instant-x{per_run}": f"instant, {per_run} at once",
        f"slow-x{per_run}": f"{delay:g} s a turn, {per_run} at once",
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median overhead share (the lower one of an even count)."""
    ranked = sorted(runs, key=lambda r: r["overhead_share"])
    return ranked[(len(ranked) - 1) // 2]


def markdown(report: dict[str, Any]) -> str:
    """The BENCHMARKS.md section of a report."""
    per_run = report["settings"]["rollouts_per_run"]
    machine, settings, configs = report["machine"], report["settings"], report["configs"]
    delay = settings["slow_policy_delay_seconds"]
    runs_label = run_labels(delay, per_run)
    x16 = f"x{per_run}"
    lines = [
        START,
        "## MCP rollouts: throughput and where the time goes (`benchmarks/mcp_rollouts.py`)",
        "",
        "`art_mcp.rollout` against the example inventory server (`examples/mcp_servers/"
        "inventory_server.py`, its own process) with a scripted policy (the test suite's "
        "OpenAI-compatible server, real HTTP on 127.0.0.1, its own process): search_items, "
        "get_item, low_stock_report, complete_task (3 tool calls, 4 policy calls a rollout). "
        f"Instant policy: answers at once (our share is as large as it gets); slow policy: "
        f"sleeps {delay:g} s before each reply (a stand-in for a small model's turn, no CPU). "
        f"Batches of {per_run} concurrent rollouts, and {per_run} one at a "
        f"time; configurations interleaved run by run, medians of {settings['repetitions']} "
        f"repetitions. Measured {machine['date']} on {machine['cpu_count']} x "
        f"{machine['cpu_model']}, mcp {machine['mcp']}, openai {machine['openai']}.",
        "",
        "| configuration | rollouts/min, instant policy | runs | rollouts/min, "
        f"{delay:g} s policy | runs | failed rollouts |",
        "|---|---:|---|---:|---|---:|",
    ]
    for key, c in configs.items():
        fast, slow = c["runs"][f"instant-{x16}"], c["runs"][f"slow-{x16}"]
        failed = sum(r["failed"] for r in c["runs"].values())
        lines.append(
            f"| {LABELS[key]} | **{fast['rollouts_per_minute']:,.0f}** | "
            f"{', '.join(f'{v:,.0f}' for v in fast['rollouts_per_minute_runs'])} | "
            f"**{slow['rollouts_per_minute']:,.0f}** | "
            f"{', '.join(f'{v:,.0f}' for v in slow['rollouts_per_minute_runs'])} | {failed} |"
        )
    lines += [
        "",
        "Per rollout (ms; each row is the repetition with the median overhead share, so that its "
        "parts add up; the share's range over the repetitions in brackets): the rollout's time, "
        "split into the policy's HTTP calls, the tool calls inside the server process, their "
        "transport, the session's open + close (or borrow + return) and the rest (our loop, "
        "waiting for the event loop). Our overhead = rollout - policy - server = transport + "
        "session + rest.",
        "",
        "| configuration | policy | rollout | policy | server | transport | session open + close "
        "| rest "
        "| our overhead | share | < 10% | queued for a session |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for key, c in configs.items():
        for run in runs_label:
            r, shares = median_run(c["raw"][run]), c["runs"][run]["overhead_share_runs"]
            ms = r["ms_per_rollout"]
            lines.append(
                f"| {LABELS[key]} | {runs_label[run]} | {ms['rollout']:.1f} | {ms['policy']:.1f} "
                f"| {ms['server']:.2f} | {ms['transport']:.1f} "
                f"| {ms['session_open']:.1f} + {ms['session_close']:.1f} "
                f"| {ms['rest']:.1f} | {ms['overhead']:.1f} | **{r['overhead_share']:.1%}** "
                f"({min(shares):.0%}-{max(shares):.0%}) "
                f"| {'yes' if r['overhead_share'] < OVERHEAD_TARGET else 'no'} "
                f"| {ms['queued_for_session']:.0f} |"
            )
    lines += [
        "",
        "CPU per rollout (ms, instant policy, one at a time): this process split by where it "
        "ran (the openai client in the policy calls, the MCP client in the tool calls, the "
        f"session's open/close or borrow/return, the rest), then the other processes; and at "
        f"{per_run} at once.",
        "",
        "| configuration | openai client | tool calls | session | rest | this process "
        "| policy server | MCP server | this process, 16 at once | MCP server, 16 at once |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, c in configs.items():
        one, many = c["runs"]["instant-x1"], c["runs"][f"instant-{x16}"]
        split, cpu = one["client_cpu_ms_per_rollout"], one["cpu_ms_per_rollout"]
        lines.append(
            f"| {LABELS[key]} | {split['openai_client']:.1f} | {split['tool_calls']:.1f} "
            f"| {split['session']:.1f} | {split['rest']:.1f} | {cpu['client']:.1f} "
            f"| {cpu['policy']:.1f} | {cpu['server']:.1f} "
            f"| {many['cpu_ms_per_rollout']['client']:.1f} "
            f"| {many['cpu_ms_per_rollout']['server']:.1f} |"
        )
    wrapper = report["wrapper_cost"]
    loads = [r["other_load_cores"] for c in configs.values() for r in c["runs"].values()]
    lines += [
        "",
        "Our wrapper around one tool call (CPU per call, median of "
        f"{wrapper['stdio']['rounds']} rounds of the 3 calls on a pooled session, alternating): "
        + "; ".join(
            f"{transport}: {w['ours_us_per_call']:.0f} us through `McpSession.call_tool` against "
            f"{w['sdk_us_per_call']:.0f} us for the SDK's `client.call_tool` alone"
            for transport, w in wrapper.items()
        )
        + f". Other load: processes outside the benchmark used {min(loads):.1f}-"
        f"{max(loads):.1f} cores during the runs (median per run; the machine is shared, 2 "
        "cores). Raw numbers: `benchmarks/results/mcp_rollouts.json`.",
        "",
        *notes(report),
        END,
    ]
    return "\n".join(lines)


def notes(report: dict[str, Any]) -> list[str]:
    per_run = report["settings"]["rollouts_per_run"]
    """The reading of the numbers, from the numbers."""
    configs = report["configs"]
    x16 = f"x{per_run}"

    def get(key: str, run: str) -> dict[str, Any]:
        return configs[key]["runs"][run]

    labels = run_labels(report["settings"]["slow_policy_delay_seconds"], per_run)
    shares = {
        (key, run): r["overhead_share"]
        for key, c in configs.items()
        for run, r in c["runs"].items()
    }
    met = [f"{LABELS[k]} ({labels[run]})" for (k, run), v in shares.items() if v < OVERHEAD_TARGET]
    out = [
        f"- Target (our overhead under {OVERHEAD_TARGET:.0%} of the rollout time): met in "
        f"{len(met)} of {len(shares)} measurements: {'; '.join(met) if met else 'none'}. "
        "With the instant policy, missed everywhere ("
        + ", ".join(
            f"{min(v for (k, r), v in shares.items() if r == run):.0%}-"
            f"{max(v for (k, r), v in shares.items() if r == run):.0%} {labels[run]}"
            for run in labels
            if run.startswith("instant")
        )
        + ")."
    ]
    for transport in ("stdio", "http"):
        new = median_run(configs[f"{transport}-new"]["raw"]["instant-x1"])
        pooled = median_run(configs[f"{transport}-pool4"]["raw"]["instant-x1"])
        out.append(
            f"- {transport}: a new session costs {new['ms_per_rollout']['session']:.0f} ms of a "
            f"rollout one at a time (pooled: {pooled['ms_per_rollout']['session']:.2f} ms); the "
            f"transport of the 3 tool calls {pooled['ms_per_rollout']['transport']:.1f} ms "
            f"against {pooled['ms_per_rollout']['server']:.1f} ms of the server's own work."
        )
    stdio_new = median_run(configs["stdio-new"]["raw"]["instant-x1"])["ms_per_rollout"]
    out.append(
        f"- Over stdio a new session is a new server process: opening it takes "
        f"{stdio_new['session_open']:.0f} ms (the server process starts: Python and its imports), "
        f"closing it {stdio_new['session_close']:.0f} ms (the SDK closes its stdin and waits for "
        "it to exit), one rollout at a time."
    )
    loop = statistics.median(
        c["runs"]["instant-x1"]["ms_per_rollout"]["rest"] for c in configs.values()
    )
    wrapper = report["wrapper_cost"]
    extra = {t: w["ours_us_per_call"] - w["sdk_us_per_call"] for t, w in wrapper.items()}
    out.append(
        f"- art_mcp's own code is a small part of the overhead: its loop (the rest column) "
        f"{loop:.1f} ms a rollout, and its wrapper around a tool call "
        + ", ".join(f"{v:+.0f} us ({t})" for t, v in extra.items())
        + " of CPU over the SDK's `call_tool`. The overhead is the MCP transport (the SDK's "
        "client and server, pipes or HTTP) and session set-up."
    )
    out.append(
        f"- {per_run} at once, the transport column also holds queueing in the server "
        "process: the rollouts call their tools together (after the policy's replies, which "
        "come together), and the server's own time per call grows with them (server column)."
    )
    slow4 = get("http-pool4", f"slow-{x16}")
    slow16 = get("http-pool16", f"slow-{x16}")
    out.append(
        f"- A pool lends a session for a whole rollout, so `pool_size` caps the rollouts in "
        f"flight: with the slow policy, HTTP with a pool of 4 gives "
        f"{slow4['rollouts_per_minute']:,.0f} rollouts/min (each rollout queued "
        f"{slow4['ms_per_rollout']['queued_for_session']:.0f} ms for a session), a pool of 16 "
        f"{slow16['rollouts_per_minute']:,.0f}: size the pool to the rollouts run at once."
    )
    return out
