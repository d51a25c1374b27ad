"""ART's module paths that are ours too: litellm choices, output folders, dev train options,
refused names at ART's paths, and ART's `backend._experimental_fork_checkpoint`."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import art_core as art
from art_core.dev import train_config
from art_core.utils.litellm import convert_litellm_choice_to_openai
from art_core.utils.output_dirs import get_output_dir_from_model_properties, get_step_checkpoint_dir
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group


def test_a_litellm_choice_converts_by_its_attribute_names():
    choice = {
        "index": 0,
        "finish_reason": "tool_calls",
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        "logprobs": {
            "content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]
        },
    }
    converted = convert_litellm_choice_to_openai(choice)
    assert converted.message.tool_calls[0].function.name == "f"  # type: ignore[index, union-attr]
    assert converted.logprobs.content[0].logprob == -0.5  # type: ignore[index, union-attr]
    with pytest.raises(ValueError, match="non-streaming"):
        convert_litellm_choice_to_openai({"index": 0, "delta": {}})


def test_output_dirs_match_the_backends_layout():
    model_dir = get_output_dir_from_model_properties("demo", "agent", ".art")
    assert get_step_checkpoint_dir(model_dir, 3) == ".art/demo/models/agent/checkpoints/0003"


def test_arts_dev_train_options_map_onto_train_config():
    config = train_config({"ppo": True, "epsilon": 0.2, "scale_rewards": False}, learning_rate=1e-4)
    assert (config.loss, config.epsilon, config.scale_rewards) == ("ppo", 0.2, "none")
    with pytest.raises(art.UnsupportedOptionError, match="plot_tensors"):
        train_config({"plot_tensors": True})


def test_a_refused_art_name_imports_and_says_what_to_use():
    from art_core import ServerlessBackend  # type: ignore[attr-defined]
    from art_core.trajectories import tokenize  # type: ignore[attr-defined]

    with pytest.raises(art.UnsupportedOptionError, match="LocalBackend"):
        ServerlessBackend()
    with pytest.raises(art.UnsupportedOptionError, match="token ids"):
        tokenize()


@pytest.mark.parametrize(
    ("module", "name", "says"),
    [
        ("art_core.serverless", "ServerlessBackend", "LocalBackend"),
        ("art_core.serverless.backend", "ServerlessBackend", "LocalBackend"),  # ART's SFT page
        ("art_core.tinker", "get_renderer_name", "chat template"),
        ("art_core.yield_trajectory", "capture_yielded_trajectory", "art.trajectory"),
        ("art_mcp", "MCPResource", "list_resources"),
    ],
)
def test_refused_names_import_from_arts_module_paths(module: str, name: str, says: str):
    stand_in = getattr(importlib.import_module(module), name)  # `from art.X import Name`, ported
    with pytest.raises(art.UnsupportedOptionError, match=f"{name} is not supported"):
        stand_in()
    with pytest.raises(art.UnsupportedOptionError) as refusal:
        stand_in.from_dict({})
    assert says in str(refusal.value)


def test_art_yield_trajectory_stays_the_function_once_its_module_is_imported():
    import art_core.yield_trajectory  # noqa: F401 - would rebind `art.yield_trajectory`, in ART too

    with pytest.raises(art.UnsupportedOptionError, match="returning it"):
        art.yield_trajectory(art.Trajectory(messages_and_choices=[]))


async def _logprobs(model: art.TrainableModel, step: int) -> list[tuple[str, float]]:
    """The tokens and logprobs `model`'s step `step` serves for one prompt at temperature 0."""
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(step),
        messages=[{"role": "user", "content": "What is 1 + 1?"}],
        max_tokens=6,
        temperature=0.0,
        logprobs=True,
    )
    content = response.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    return [(entry.token, entry.logprob) for entry in content]


def _same_policy(served: list[tuple[str, float]], other: list[tuple[str, float]]) -> bool:
    """The same tokens, with logprobs equal up to float noise."""
    tokens, logprobs = zip(*served, strict=True) if served else ((), ())
    other_tokens, other_logprobs = zip(*other, strict=True) if other else ((), ())
    return tokens == other_tokens and list(logprobs) == pytest.approx(
        list(other_logprobs), abs=1e-4
    )


async def test_experimental_fork_checkpoint_starts_from_the_sources_step_at_or_before(
    backend: art.RemoteBackend, tiny_model_dir: Path
):
    source = await fresh_model(backend, tiny_model_dir)
    for _ in range(2):
        groups = varied_group(await groups_for(source, ["What is 1 + 1?", "What is 2 + 3?"]))
        await source.train(groups, config=art.TrainConfig(learning_rate=5e-3))
    assert source.step == 2
    step_1, step_2 = await _logprobs(source, 1), await _logprobs(source, 2)
    assert not _same_policy(step_1, step_2)  # else this test could not tell the steps apart

    fork = art.TrainableModel(
        name=f"{source.name}-fork", project=source.project, base_model=source.base_model
    )
    # ART's signature: the model to create, the source by name, the last step to take.
    await backend._experimental_fork_checkpoint(
        fork, from_model=source.name, not_after_step=1, verbose=True
    )
    assert fork.step == 1 and await fork.get_step() == 1
    assert _same_policy(await _logprobs(fork, 1), step_1)

    # ART forks into a registered model; here the fork is the registration, and the refusal says so.
    with pytest.raises(art.UnsupportedOptionError) as refusal:
        await backend._experimental_fork_checkpoint(fork, from_model=source.name)
    message = str(refusal.value)
    assert "already registered" in message
    assert "instead of model.register(backend)" in message and "fork_from=" in message
