"""Rollout functions the Ray workers import by name (tests.ray._rollouts)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import openai

import art_core as art


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


async def two_turn_rollout(
    model: art.TrainableModel, question: str, reward: float | None = None
) -> art.Trajectory:
    """Two chat turns in a zero-change capture scope (`model.rollout()`), on whatever node."""
    async with model.rollout() as capture:
        client = openai.AsyncOpenAI(base_url=capture.base_url, api_key=capture.api_key)
        messages: list = [{"role": "user", "content": question}]
        for _ in range(2):
            completion = await client.chat.completions.create(
                model=capture.model, messages=messages, max_tokens=6, temperature=1.0
            )
            messages += [
                {"role": "assistant", "content": completion.choices[0].message.content or ""},
                {"role": "user", "content": "And then?"},
            ]
        capture.reward = float(len(messages[-2]["content"]) % 5) if reward is None else reward
        capture.metadata["node_id"] = _node_id()
    return capture.trajectory


async def failing_rollout(model: art.TrainableModel, question: str) -> art.Trajectory:
    raise ValueError(f"{question!r} fails on purpose")


async def group_rollout(
    model: art.TrainableModel, question: str, config: None
) -> art.TrajectoryGroup:
    """A PipelineTrainer rollout_fn: a group of four pending runs, one of which raises."""
    runs = [two_turn_rollout(model, question, reward=float(index)) for index in range(3)]
    return art.TrajectoryGroup([*runs, failing_rollout(model, question)])


async def slow_rollout(marks: str, index: int, seconds: float) -> art.Trajectory:
    """Marks that it started (a file per run), then sleeps: long enough to kill its node."""
    Path(marks, f"{index}-{os.getpid()}").write_text(_node_id())
    started = time.monotonic()
    await asyncio.sleep(seconds)
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": str(index)}],
        reward=float(index),
        metadata={"node_id": _node_id(), "slept": time.monotonic() - started},
    )


async def waiting_rollout(marks: str, index: int, release: str) -> art.Trajectory:
    """Marks that it started (`<index>-<pid>`), then awaits until the file `release` exists."""
    Path(marks, f"{index}-{os.getpid()}").write_text(_node_id())
    while not Path(release).exists():
        await asyncio.sleep(0.05)
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": str(index)}],
        reward=float(index),
        metadata={"pid": os.getpid()},
    )


def busy_rollout(marks: str, index: int, release: str) -> art.Trajectory:
    """A plain `def` (run on a worker thread) that marks that it started, then spins the CPU
    until the file `release` exists."""
    Path(marks, f"busy-{index}-{os.getpid()}").write_text(_node_id())
    while not Path(release).exists():
        sum(range(10_000))
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": str(index)}],
        reward=float(index),
        metadata={"node_id": _node_id()},
    )


# ------------------------------------------------ rollouts that would poison their worker's loop


async def exiting_rollout(seconds: float) -> art.Trajectory:
    raise SystemExit(3)


async def interrupted_rollout(seconds: float) -> art.Trajectory:
    raise KeyboardInterrupt


def sync_exiting_rollout(seconds: float) -> art.Trajectory:
    raise SystemExit("a plain def exits")


def sync_sleeping_rollout(seconds: float) -> art.Trajectory:
    time.sleep(seconds)
    raise AssertionError("never reached: the deadline is shorter")


def sync_spinning_rollout(seconds: float) -> art.Trajectory:
    _spin(seconds)
    raise AssertionError("never reached: the deadline is shorter")


async def loop_sleeping_rollout(seconds: float) -> art.Trajectory:
    time.sleep(seconds)  # no await: the worker's loop is held
    raise AssertionError("never reached: the worker is replaced")


async def loop_spinning_rollout(marks: str, seconds: float) -> art.Trajectory:
    """Marks that it started (`spinning-<pid>`), then holds the worker's loop: no await."""
    Path(marks, f"spinning-{os.getpid()}").write_text(_node_id())
    _spin(seconds)
    raise AssertionError("never reached: the worker is replaced")


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(10_000))


async def exiting_task_rollout(seconds: float) -> art.Trajectory:
    """SystemExit in a task the rollout created: out of a Task it would stop the loop."""

    async def exit_now() -> None:
        raise SystemExit(4)

    await asyncio.create_task(exit_now())
    raise AssertionError("never reached")
