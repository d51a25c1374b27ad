"""ART tutorials run with the import changed to `import art_core as art`, on the tiny model.

The code is transcribed from two published ART tutorials: an ART cheatsheet (model, rollout,
training loop) and a W&B article (a multiplication agent). What had to change, and nothing else:
`base_model` is the tiny test model and `art.LocalBackend()` gets a temporary folder and float32
(the tutorials' defaults would write `.art/` into the repository and pick bf16 on this CPU);
`@weave.op` is dropped (weave is not installed); the tutorials' placeholders (`score`,
`scenarios`, `NUM_STEPS`, `GROUP_SIZE`) are defined small; `wandb.log` is left out; top-level
`await` runs inside the test.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import art_core as art


def tutorial_local_backend(path: Path, engine_options: dict) -> art.LocalBackend:
    """`art.LocalBackend()` of the tutorials, in a temporary folder, on the session's engine."""
    vllm = engine_options.get("vllm")
    return art.LocalBackend(
        path=path / ".art",
        dtype="float32",
        extra_args=["--engine", "vllm", "--vllm-url", vllm.url] if vllm else None,
    )


@pytest.fixture
async def tutorial_backend(tmp_path: Path, engine_options: dict) -> AsyncIterator[art.LocalBackend]:
    backend = tutorial_local_backend(tmp_path, engine_options)
    yield backend
    await backend.close()


@pytest.fixture(scope="module")
async def multiplication_backend(
    tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> AsyncIterator[art.LocalBackend]:
    """One backend for the multiplication tutorial's tests (each registers the same model)."""
    backend = tutorial_local_backend(tmp_path_factory.mktemp("multiplication"), engine_options)
    yield backend
    await backend.close()


# ------------------------------------------------------------------------- the ART cheatsheet


@dataclass
class Scenario:
    prompt: str


async def test_cheatsheet_defines_registers_rolls_out_and_trains(
    tutorial_backend: art.LocalBackend, tiny_model_dir: Path
):
    # The tutorial's placeholders: two scenarios, groups of four, one step, and a reward function
    # (cycling 0..3, so that every group has rewards that differ and trains).
    scenarios = [Scenario("Say hi."), Scenario("Name a colour.")]
    NUM_STEPS, GROUP_SIZE = 1, 4
    rewards = itertools.count()

    def score(content: str | None, scenario: Scenario) -> float:
        return float(next(rewards) % 4)

    # --- Defining a Model
    model = art.TrainableModel(
        name="agent-001",
        project="my-agent",
        base_model=str(tiny_model_dir),
    )
    backend = tutorial_backend  # art.LocalBackend() # or a remote backend
    await model.register(backend)

    # --- Writing a Rollout
    async def rollout(model: art.Model, scenario) -> art.Trajectory:
        client = model.openai_client()
        traj = art.Trajectory(messages_and_choices=[], reward=0.0)
        messages = [{"role": "user", "content": scenario.prompt}]
        completion = await client.chat.completions.create(
            model=model.name,
            messages=messages,  # type: ignore[arg-type]
        )
        choice = completion.choices[0]
        traj.messages_and_choices.append(choice)
        traj.reward = score(choice.message.content, scenario)  # your reward fn
        return traj

    # --- Training Loop
    for _step in range(NUM_STEPS):
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(model, s) for _ in range(GROUP_SIZE)) for s in scenarios
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))

    # --- model.get_step(): the current training step (for checkpointing/resume)
    assert await model.get_step() == NUM_STEPS
    served = [entry.id for entry in (await model.openai_client().models.list()).data]
    assert "agent-001" in served and f"agent-001@{NUM_STEPS}" in served


# ------------------------------------------------------------- the W&B multiplication tutorial


async def register_tutorial_model(backend: art.LocalBackend, base_model: Path):
    """Step 2 of the tutorial: the model and its backend."""
    # Create a trainable model instance
    model = art.TrainableModel(
        name="agent-001",  # an arbitrary name for your model (used for logging)
        project="my-agentic-task",  # W&B project name for grouping runs
        base_model=str(base_model),  # base model to fine-tune
    )
    # Register the model with the backend (prepare the backend server)
    await model.register(backend)
    return model


async def test_multiplication_tutorial_registers_and_answers_by_model_name(
    multiplication_backend: art.LocalBackend, tiny_model_dir: Path
):
    model = await register_tutorial_model(multiplication_backend, tiny_model_dir)
    openai_client = model.openai_client()

    # --- Step 6: Evaluate the trained agent
    test_questions = ["What is 7 8?", "What is 15 14?", "What is 3 * 19?"]
    for q in test_questions:
        completion = await openai_client.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": q}],
        )
        answer = completion.choices[0].message.content.strip()  # type: ignore[union-attr]
        print(f"Q: {q} -> A: {answer}")
        assert completion.model == "agent-001@0"  # the latest step answered


@pytest.mark.filterwarnings("ignore:Trajectory\\(messages=:DeprecationWarning")
async def test_multiplication_tutorial_rollouts_as_written(
    multiplication_backend: art.LocalBackend, tiny_model_dir: Path
):
    model = await register_tutorial_model(multiplication_backend, tiny_model_dir)

    # --- Step 3: Define one scenario rollout for the multiplication task
    async def rollout(model: art.TrainableModel) -> art.Trajectory:
        # Step 1: Prepare a random multiplication problem
        a = random.randint(1, 20)
        b = random.randint(1, 20)
        question = f"What is {a} * {b}?"
        # We use the model's OpenAI-compatible client for inference
        openai_client = model.openai_client()
        messages = [{"role": "user", "content": question}]
        # Step 2: Get the model's answer
        completion = await openai_client.chat.completions.create(
            model=model.name,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=10,
        )
        answer = completion.choices[0].message.content.strip()  # type: ignore[union-attr]

        # Step 3: Calculate reward based on correctness
        correct_answer = str(a * b)
        if answer == correct_answer:  # noqa: SIM108 - as the tutorial writes it
            reward_value = 1.0  # correct answer, positive reward
        else:
            reward_value = -1.0  # incorrect answer, negative reward

        # Step 4: Package into a Trajectory and assign reward
        trajectory = art.Trajectory(messages=messages + [{"role": "assistant", "content": answer}])  # noqa: RUF005
        trajectory.reward = reward_value
        return trajectory

    # --- Step 4: Run training iterations (the tutorial's loop; no wandb here)
    training_steps = 1
    rollouts_per_step = 8  # how many problems to attempt per step (parallel rollouts)
    for _step in range(training_steps):
        trajectories = [rollout(model) for _ in range(rollouts_per_step)]
        trajectories = await asyncio.gather(*trajectories)
        avg_reward = sum(t.reward for t in trajectories) / len(trajectories)
        assert -1.0 <= avg_reward <= 1.0

    # Beyond the tutorial (its training is pseudo-code): the trajectories it built from the
    # answer text, with ART's first field name `messages=`, train on the exact tokens the server
    # sampled, matched by conversation and answer.
    for index, trajectory in enumerate(trajectories):
        trajectory.reward = float(index % 2)  # a spread, so the group trains
    result = await model.train([art.TrajectoryGroup(trajectories)])
    assert result.metrics["matched_assistant_messages"] == rollouts_per_step
    assert result.metrics.get("dropped/unmatched_assistant_messages", 0) == 0
    assert result.metrics["trained_tokens"] > 0
