"""One cookbook-style RL step on SmolLM2 through the Tinker API against the same step through
`art_core`, on one art-server (a child process on 127.0.0.1).

- A, `art_core`: a RemoteBackend model samples each prompt's group through Chat Completions
  (`n` = group size, one request per prompt), scores it, and `backend.train` runs one step
  (GRPO advantages, ART's cispo loss; the server commits and serves the new step).
- B, the Tinker API (the cookbook's `rl_loop.py`): `save_weights_for_sampler`, a sampling
  client, `sample(num_samples=group size)` per prompt, the same reward, the cookbook's datums
  (reward minus the group's mean), `forward_backward("cispo")` and `optim_step`.

Both: the same prompts (examples/data/tinker_arithmetic_train.jsonl), group size, max_tokens,
temperature 1, learning rate, a rank-8 LoRA with alpha 32 on attention and MLP (Tinker's), and
rewards by a sample's place in its group (0, 1, 2, ...): every group trains on both sides, so the
two steps do the same work (a real reward leaves a random number of groups untrained). Steps
run in interleaved pairs (A B, then B A, ...), so drift on the shared machine hits both alike;
the CPU other processes used during each step is recorded beside it. Reported: the median step
time of each and B/A (the issue's bar: the Tinker path adds at most 10 %).

    .venv/bin/python benchmarks/tinker_step.py [--pairs 3] [--prompts 4] [--group 4]

Writes benchmarks/results/tinker_step.json and its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
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
from tinker_rl_loop import group_datums, load, prompt_tokens

import art_core as art

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "tinker_step.json"
START, END = "<!-- tinker_step:start -->", "<!-- tinker_step:end -->"
MODEL = "smollm2-135m-instruct"
KEY = "tml-bench-key"
LEARNING_RATE = 1e-4
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    return parser.parse_args(argv)


class ArtCoreStep:
    """A: rollouts through Chat Completions, one `backend.train` step."""

    def __init__(self, url: str, rows: list[dict], args: argparse.Namespace):
        self.backend = art.RemoteBackend(url, KEY)
        lora = art.LoRAConfig(r=8, alpha=32, target_modules=MODULES)
        self.model = art.TrainableModel(
            name="bench-art", project="bench", base_model=MODEL, lora=lora
        )
        self.rows, self.args = rows, args

    async def setup(self) -> None:
        await self.model.register(self.backend)

    async def group(self, row: dict) -> art.TrajectoryGroup:
        messages = [{"role": "user", "content": f"{row['question']} Answer with the number only."}]
        reply = await self.model.openai_client().chat.completions.create(
            model=self.model.get_inference_name(),
            messages=messages,  # type: ignore[arg-type]
            max_tokens=self.args.max_tokens,
            temperature=1.0,
            n=self.args.group,
        )
        return art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*messages, choice], reward=float(place))
            for place, choice in enumerate(reply.choices)
        )

    async def step(self) -> dict[str, float]:
        started = time.perf_counter()
        groups = await asyncio.gather(*(self.group(row) for row in self.rows))
        sampled = time.perf_counter()
        await self.backend.train(self.model, groups, learning_rate=LEARNING_RATE)
        return {"sample": sampled - started, "train": time.perf_counter() - sampled}


class TinkerStep:
    """B: the cookbook's loop body through the Tinker SDK."""

    def __init__(self, url: str, rows: list[dict], args: argparse.Namespace):
        import tinker

        self.tinker = tinker
        self.service = tinker.ServiceClient(base_url=url, api_key=KEY)
        self.rows, self.args, self.number = rows, args, 0

    async def setup(self) -> None:
        self.training = await self.service.create_lora_training_client(
            base_model=MODEL, rank=8, seed=0, train_unembed=False
        )
        self.tokenizer = self.training.get_tokenizer()

    async def step(self) -> dict[str, float]:
        return await asyncio.to_thread(self._step)

    def _step(self) -> dict[str, float]:
        types = self.tinker.types
        self.number += 1
        started = time.perf_counter()
        path = self.training.save_weights_for_sampler(name=f"{self.number:06d}").result().path
        sampler = self.service.create_sampling_client(model_path=path).result()
        saved = time.perf_counter()
        params = types.SamplingParams(max_tokens=self.args.max_tokens, temperature=1.0)
        futures = []
        for row in self.rows:
            prompt = prompt_tokens(self.tokenizer, f"{row['question']}")
            future = sampler.sample(types.ModelInput.from_ints(prompt), self.args.group, params)
            futures.append((prompt, future))
        datums = []
        for prompt, future in futures:
            sequences = future.result().sequences
            datums += group_datums(prompt, sequences, [float(i) for i in range(len(sequences))])
        sampled = time.perf_counter()
        backward = self.training.forward_backward(datums, "cispo")
        optim = self.training.optim_step(types.AdamParams(learning_rate=LEARNING_RATE))
        backward.result(), optim.result()
        # The checkpoint the next step samples from is this step's commit (art_core's train
        # commits it at its end): counted with the training.
        return {
            "sample": sampled - saved,
            "train": time.perf_counter() - sampled + saved - started,
        }


async def measure(args: argparse.Namespace, url: str) -> dict[str, Any]:
    rows = load(ROOT / "examples" / "data" / "tinker_arithmetic_train.jsonl")[: args.prompts]
    sides = {"art_core": ArtCoreStep(url, rows, args), "tinker": TinkerStep(url, rows, args)}
    for side in sides.values():
        await side.setup()
    for side in sides.values():  # one unmeasured step each: caches, first adapter loads
        await side.step()
    times: dict[str, list[float]] = {name: [] for name in sides}
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    loads: dict[str, list[float]] = {name: [] for name in sides}
    for pair in range(args.pairs):
        order = ["art_core", "tinker"] if pair % 2 == 0 else ["tinker", "art_core"]
        for name in order:
            with OtherLoad() as other:
                started = time.perf_counter()
                phases[name].append(await sides[name].step())
                times[name].append(time.perf_counter() - started)
            loads[name].append(round(other.cores, 2))
            print(
                f"pair {pair + 1}: {name} {times[name][-1]:.2f} s (other load {other.cores:.2f} cores)"
            )
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "seconds": times,
        "phases": phases,
        "median_phase_seconds": {
            name: {key: statistics.median(p[key] for p in runs) for key in runs[0]}
            for name, runs in phases.items()
        },
        "other_load_cores": loads,
        "median_seconds": medians,
        "tinker_over_art_core": medians["tinker"] / medians["art_core"],
    }


def section(result: dict[str, Any]) -> str:
    m = result["median_seconds"]
    p = result["median_phase_seconds"]
    ratio = result["tinker_over_art_core"]
    load = statistics.mean(v for values in result["other_load_cores"].values() for v in values)
    return f"""{START}
## One RL step through the Tinker API vs through art_core (issue 40)

`benchmarks/tinker_step.py`: SmolLM2-135M-Instruct on one art-server, {result["prompts"]} prompts
x {result["group"]} samples of up to {result["max_tokens"]} tokens, a rank-8 LoRA (alpha 32, attention
and MLP), cispo, interleaved pairs ({result["pairs"]}); other processes used {load:.2f} cores on
average during the steps ({result["machine"]["cpu_count"]} CPUs).

| path | median step (s) | sampling | training (with the checkpoint) |
| --- | --- | --- | --- |
| art_core (`backend.train` after Chat Completions rollouts) | {m["art_core"]:.2f} | {p["art_core"]["sample"]:.2f} | {p["art_core"]["train"]:.2f} |
| Tinker API (the cookbook's loop body through the SDK) | {m["tinker"]:.2f} | {p["tinker"]["sample"]:.2f} | {p["tinker"]["train"]:.2f} |

Tinker / art_core: **{ratio:.2f}** (the bar: at most 1.10).
{END}"""


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    with tempfile.TemporaryDirectory() as folder:
        process, url = start_art_server(MODEL, Path(folder), KEY)
        try:
            result = asyncio.run(measure(args, url))
        finally:
            process.terminate()
            process.wait(30)
    result.update(
        pairs=args.pairs, prompts=args.prompts, group=args.group, max_tokens=args.max_tokens,
        machine=machine_info("torch", "transformers", "tinker"),
    )  # fmt: skip
    publish(result, RESULTS, START, END, section(result))


if __name__ == "__main__":
    main()
