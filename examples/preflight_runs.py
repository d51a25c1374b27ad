"""Preflight ("will this learn?") on the CPU examples, before any of them trains.

    python examples/preflight_runs.py demo autorl react react-sft   # SmolLM2-135M, CPU, offline

Each preflight rolls out 2 groups with the example's own rollout and configuration (group size,
temperature, judge), without training, and prints the verdict with the one change most likely
to help; `--json-dir DIR` also writes each result as JSON. The examples:

- `demo`: the demo task (examples/demo.py's rollout, exact code reward, 8 steps of 8 x 8);
- `autorl`: the offline AutoRL run (examples/autorl.py: generated bike-shop scenarios, the
  one-answer agent at temperature 1, RULER with SmolLM2-135M itself as the judge);
- `react`: the LangGraph ReAct agent (examples/langgraph_react_agent.py's rollout and agent,
  untrained: no SFT warm start);
- `react-sft`: the same after the example's own SFT step on its scripted demonstrations.

Measured results are in docs/preflight.md, section "Measured".
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2 import smollm2_trainable

import art_core as art
from art_core.rewards._autorl import one_answer_agent


async def demo_preflight(
    model: art.TrainableModel, backend: art.LocalBackend
) -> art.PreflightResult:
    """The demo task with the demo's defaults (10 steps of 8 groups x 8 rollouts)."""
    import demo
    from demo_task import split

    train, _ = split(200, 64)
    return await art.preflight(
        model, demo.rollout, train, rollouts_per_group=8, steps=10, groups_per_step=8
    )


async def autorl_preflight(
    model: art.TrainableModel, backend: art.LocalBackend
) -> art.PreflightResult:
    """The offline AutoRL defaults: 4 steps of 4 groups x 4, the base model as generator and
    judge, generated scenarios (as `art.autorl` makes them), answers at temperature 1."""
    import autorl

    judge = await art.judge_or_base_model(None, backend, "smollm2-135m-instruct")
    scenarios = await art.generate_scenarios(
        autorl.TASK,
        4,
        judge,
        sampling={"temperature": 0.7, "top_p": 0.9},
        batch_size=3,
        concurrency=8,
    )
    answer = one_answer_agent(model, autorl.TASK, max_tokens=64)

    async def rollout(_model: Any, scenario: art.Scenario) -> art.Trajectory:
        return await answer(scenario, 1.0)  # AutoRL trains on answers sampled at 1.0

    return await art.preflight(
        model,
        rollout,
        scenarios,
        judge=judge,
        judge_options={"sampling": {"temperature": 0.0}},
        rollouts_per_group=4,
        steps=4,
        groups_per_step=4,
    )


async def react_preflight(
    model: art.TrainableModel, backend: art.LocalBackend, *, warm_start: bool = False
) -> art.PreflightResult:
    """The LangGraph ReAct example's rollout and agent as its defaults build them (its group
    size, temperature and tokens a turn), on the untrained model; with `warm_start`, first the
    example's own SFT step on its scripted demonstrations (a new model, so `react` stays base)."""
    import langgraph_react_agent as react

    import art_langgraph

    options = react.parse_args([])
    if warm_start:
        from art_core.utils.sft import train_sft_from_file

        model = smollm2_trainable(f"{model.name}-sft", "preflight")
        await model.register(backend)
    train, _ = react.split_tasks(options.eval_size, seed=options.seed)
    llm = art_langgraph.TrainableChatModel(
        model, temperature=options.temperature, max_tokens=options.max_tokens
    )
    agent = react.build_agent(llm, forced_tool_turns=options.forced_tool_turns)
    if warm_start:
        greedy = art_langgraph.TrainableChatModel(model, temperature=0.0, max_tokens=48)
        folder = backend.path / "preflight" / model.name
        folder.mkdir(parents=True, exist_ok=True)
        demos = react.write_demonstrations(greedy, train[: options.demos], folder / "demos.jsonl")
        started = time.monotonic()
        await train_sft_from_file(
            model,
            str(demos),
            epochs=options.sft_epochs,
            batch_size=options.sft_batch_size,
            peak_lr=options.sft_learning_rate,
        )
        print(
            f"SFT warm start: {options.demos} demonstrations in {time.monotonic() - started:.0f} s"
        )

    async def rollout(model: art.TrainableModel, task: Any) -> art.Trajectory:
        return await react.rollout(model, agent, task)

    return await art.preflight(
        model,
        rollout,
        train,
        rollouts_per_group=options.rollouts_per_group,
        steps=options.steps,
        groups_per_step=options.groups_per_step,
    )


async def react_sft_preflight(
    model: art.TrainableModel, backend: art.LocalBackend
) -> art.PreflightResult:
    """The ReAct example after its SFT warm start (what its RL steps start from)."""
    return await react_preflight(model, backend, warm_start=True)


PREFLIGHTS = {
    "demo": demo_preflight,
    "autorl": autorl_preflight,
    "react": react_preflight,
    "react-sft": react_sft_preflight,
}


async def main(args: argparse.Namespace) -> None:
    backend = art.LocalBackend(path=args.path)
    model = smollm2_trainable(time.strftime("preflight-%Y%m%d-%H%M%S"), "preflight")
    print(f"Starting the backend (SmolLM2-135M-Instruct on CPU) under {args.path}/ ...")
    await model.register(backend)
    try:
        for name in args.examples:
            print(f"\n=== {name} ===", flush=True)
            result = await PREFLIGHTS[name](model, backend)
            print(result.text(), flush=True)
            if args.json_dir:
                Path(args.json_dir).mkdir(parents=True, exist_ok=True)
                (Path(args.json_dir) / f"{name}.json").write_text(result.to_json())
    finally:
        await backend.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", nargs="*", help=f"some of {', '.join(PREFLIGHTS)} (all)")
    parser.add_argument("--path", default=".art")
    parser.add_argument("--json-dir", default=None)
    args = parser.parse_args(argv)
    unknown = [name for name in args.examples if name not in PREFLIGHTS]
    if unknown:
        parser.error(f"unknown example(s) {unknown}; known: {', '.join(PREFLIGHTS)}")
    args.examples = args.examples or list(PREFLIGHTS)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
