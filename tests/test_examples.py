"""The examples a user copies import cleanly and take their documented options (most run in
full only by hand: each trains SmolLM2 for minutes; the Anthropic SDK agent runs here, shrunk,
on the tiny model)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "name",
    ["demo", "autorl", "langgraph_react_agent", "langgraph_planner_ruler", "ruler_oracle_demo"],
)
def test_example_imports_and_parses_its_defaults(name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, f"example_{name}", module)
    spec.loader.exec_module(module)
    args = module.parse_args([])
    assert args.steps > 0 and args.path == ".art"


def test_preflight_runs_example_imports_and_names_its_runs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(
        "example_preflight", EXAMPLES / "preflight_runs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "example_preflight", module)
    spec.loader.exec_module(module)
    assert module.parse_args([]).examples == ["demo", "autorl", "react", "react-sft"]


async def test_anthropic_agent_example_trains_the_tiny_model_and_evaluates_before_and_after(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tmp_path: Path, capsys
):
    """The Anthropic SDK agent runs end to end here, shrunk: the tiny model for SmolLM2
    (`--base-model`), one step of one group of two runs, two held-out questions. The tiny model
    is random, so the test adds 1 to every other run's reward: a group with a spread trains."""
    spec = importlib.util.spec_from_file_location(
        "example_anthropic_agent", EXAMPLES / "anthropic_agent.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "example_anthropic_agent", module)
    spec.loader.exec_module(module)
    assert module.parse_args([]).base_model == "smollm2-135m-instruct"
    runs = itertools.count()
    example_score = module.score

    def spread_score(*args):
        scores = example_score(*args)
        return scores | {"reward": scores["reward"] + next(runs) % 2}

    monkeypatch.setattr(module, "score", spread_score)

    shrunk = ["--base-model", str(tiny_model_dir), "--path", str(tmp_path / ".art"), "--steps", "1"]
    shrunk += ["--groups-per-step", "1", "--rollouts-per-group", "2", "--eval-size", "2"]
    results = await module.main(module.parse_args(shrunk))

    for evaluation in (results["before"], results["after"]):
        assert set(evaluation) == {"reward", "right_call", "exact", "contains"}
        assert all(0.0 <= evaluation[part] <= 1.0 for part in ("right_call", "exact", "contains"))
    printed = capsys.readouterr().out
    assert "step 1: train reward" in printed and "after (step 1)" in printed
