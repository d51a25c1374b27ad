"""The examples a user copies import cleanly and take their documented options (they run in
full only by hand: each trains SmolLM2 for minutes)."""

from __future__ import annotations

import importlib.util
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
