"""ART's module paths that are ours too: litellm choices, output folders, dev train options."""

from __future__ import annotations

import pytest

import art_core as art
from art_core.dev import train_config
from art_core.utils.litellm import convert_litellm_choice_to_openai
from art_core.utils.output_dirs import get_output_dir_from_model_properties, get_step_checkpoint_dir


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
