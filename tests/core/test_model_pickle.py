"""A model goes to a rollout worker in another process (Ray, multiprocessing) by pickle: a
detached copy that reaches the same server, whose trajectories come back and train."""

from __future__ import annotations

import pickle
import subprocess
import sys

import art_core as art

WORKER = """
import asyncio, pickle, sys

import openai

model = pickle.loads(sys.stdin.buffer.read())


async def main():
    async with model.rollout() as capture:
        client = openai.AsyncOpenAI(base_url=capture.base_url, api_key=capture.api_key)
        completion = await client.chat.completions.create(
            model=capture.model,
            messages=[{"role": "user", "content": "Count to three."}],
            max_tokens=4,
        )
        capture.reward = float(len(completion.choices[0].message.content or ""))
    return capture.trajectory


trajectory = asyncio.run(main())
sys.stdout.buffer.write(pickle.dumps((model.get_inference_name(), model.step, trajectory)))
"""


async def test_a_pickled_model_rolls_out_in_another_process_and_its_runs_train(
    model: art.TrainableModel,
):
    model.pending_metrics["client/counted"] += 1
    copy = pickle.loads(pickle.dumps(model))
    # Detached: the same names, step and server; no trackers, no counts, its own HTTP client.
    assert copy.get_inference_name() == model.get_inference_name()
    assert copy.inference_base_url == model.inference_base_url
    assert type(copy.backend) is art.RemoteBackend  # a LocalBackend's child stays the parent's
    assert copy.observers == [] and not copy.pending_metrics
    assert model.pending_metrics["client/counted"] == 1  # the original is untouched

    trajectories = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", WORKER],
            input=pickle.dumps(model),
            capture_output=True,
            check=True,
            timeout=120,
        )
        name, step, trajectory = pickle.loads(done.stdout)
        assert (name, step) == (model.get_inference_name(), model.step)
        assert [m["role"] for m in trajectory.messages()] == ["user", "assistant"]
        trajectories.append(trajectory)
    trajectories[1].reward = trajectories[0].reward + 1.0  # two runs that differ in reward
    result = await model.train([art.TrajectoryGroup(trajectories)])
    # The worker's choices kept their exact tokens: the step trained them, sampler and trainer
    # agreeing on every token's logprob.
    assert result.metrics["trained"] == 1.0 and result.metrics["trajectories"] == 2
    assert abs(result.metrics["ratio_mean"] - 1.0) < 1e-3
