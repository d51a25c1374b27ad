"""Every name ART 0.5.23 exports, imported from our corresponding module and classified.

`art_0_5_23_names.json` is the list (read from the 0.5.23 wheel; how, in its `source`). Each name
is one of: supported (the same name at our module path works), mapped (it works under another
name or path, given in MAPPED), partly (supported, but one of ART's documented calls of it, in
tests/compat/art_docs_blocks.json, does not bind to ours), refused (it imports from our module, and using it raises
UnsupportedOptionError with the reason; `art_core/_refused_art_names.py`). A name that is none of these
fails the test, and so does a refused name our module does not serve: every ART module has ours.

The table in docs/art-compatibility.md is generated here; refresh it with
`ART_UPDATE_COMPAT=1 .venv/bin/python -m pytest tests/compat/test_art_names.py`.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from art_core import UnsupportedOptionError, _refused_art_names

HERE = Path(__file__).parent
PAGE = HERE.parents[1] / "docs" / "art-compatibility.md"
START, END = "<!-- art-names:start -->", "<!-- art-names:end -->"
NAMES = json.loads((HERE / "art_0_5_23_names.json").read_text())

# ART module -> ours ("module:Class" for a class's methods).
MODULES: dict[str, str] = {
    "art": "art_core",
    "art.dev": "art_core.dev",
    "art.local": "art_core.local",
    "art.utils": "art_core.utils",
    "art.pipeline_trainer": "art_core.pipeline_trainer",
    "art.rewards": "art_core.rewards",
    "art.langgraph": "art_core.langgraph",
    "art.mcp": "art_core.mcp",
    "art.serverless": "art_core.serverless",
    "art.tinker": "art_core.tinker",
    "art.tinker_native": "art_core.tinker_native",
    "art.trajectories": "art_core.trajectories",
    "art.types": "art_core.types",
    "art.model": "art_core.model",
    "art.backend": "art_core.backend",
    "art.gather": "art_core.gather",
    "art.batches": "art_core.batches",
    "art.errors": "art_core.errors",
    "art.utils.litellm": "art_core.utils.litellm",
    "art.utils.output_dirs": "art_core.utils.output_dirs",
    "art.utils.deployment": "art_core.utils.deployment",
    "art.utils.deployment.wandb": "art_core.utils.deployment.wandb",
    "art.utils.sft": "art_core.utils.sft",
    "art.pipeline_trainer.trainer": "art_core.pipeline_trainer.trainer",
    "art.yield_trajectory": "art_core.yield_trajectory",
    "art.local.LocalBackend": "art_core.local:LocalBackend",
    "art.auto_trajectory": "art_core.auto_trajectory",
    "art.adapter_leases": "art_core.adapter_leases",
    "art.local.adapter_leases": "art_core.local.adapter_leases",
}

_CAPTURE = "capture scopes live in art_core.capture (also `art.<name>`)"
_ALIASES = "ART's type aliases for annotations live beside Trajectory"
# (ART module, name) -> (our "module:attribute", what differs).
MAPPED: dict[tuple[str, str], tuple[str, str]] = {
    ("art", "PipelineRuntimeConfig"): ("art_core.pipeline_trainer:PipelineRuntimeConfig", "in the pipeline trainer's module"),
    ("art.trajectories", "current_trajectory"): ("art_core.capture:current_trajectory", _CAPTURE),
    ("art.trajectories", "no_capture"): ("art_core.capture:no_capture", _CAPTURE),
    ("art.trajectories", "trajectory"): ("art_core.capture:trajectory", _CAPTURE),
    ("art.trajectories", "trajectory_group"): ("art_core.capture:trajectory_group", _CAPTURE),
    ("art.types", "Message"): ("art_core.trajectories:Message", _ALIASES),
    ("art.types", "MessageOrChoice"): ("art_core.trajectories:MessageOrChoice", _ALIASES),
    ("art.types", "Messages"): ("art_core.trajectories:Messages", _ALIASES),
    ("art.types", "MessagesAndChoices"): ("art_core.trajectories:MessagesAndChoices", _ALIASES),
    ("art.types", "Tools"): ("art_core.trajectories:Tools", _ALIASES),
    ("art.errors", "ARTError"): ("art_core.errors:ArtError", "the base of our error hierarchy"),
    ("art.mcp", "MCPTool"): ("art_mcp:McpTool", "MCP integration in integrations/mcp"),
    ("art.mcp", "GeneratedScenario"): (
        "art_core:Scenario",
        "a pydantic model with its fields: `Scenario(task=, difficulty=)` (difficulty 1-10, optional "
        "`expected`); model_dump() / model_validate() for to_dict() / from_dict()",
    ),
    ("art.mcp", "complete_task_tool"): (
        "art_mcp:COMPLETE_TASK",
        "the same `complete_task(summary)` tool as an OpenAI tool dict (ART's "
        "`complete_task_tool.to_tool_schema()`); art_mcp.rollout offers it to the agent itself",
    ),
    ("art.local.LocalBackend", "_experimental_fork_checkpoint"): (
        "art_core.local:LocalBackend._experimental_fork_checkpoint",
        "registers the model forked: `model.register(backend, fork_from=, fork_step=)`; call it in place of register",
    ),
    **{
        (module, name): (
            f"art_core.{module.removeprefix('art.')}:{name}",
            "ART's signature; hosting is not part of this library (the backend serves every step "
            "as `<name>@<step>`): it raises UnsupportedOptionError naming the adapter's folder "
            "and how to upload it",
        )
        for module, name in [
            ("art.utils.deployment", "deploy_model"),
            ("art.utils.deployment", "deploy_wandb"),
            ("art.utils.deployment.wandb", "deploy_wandb"),
        ]
    },
    ("art.auto_trajectory", "auto_trajectory"): ("art_core.capture:current_trajectory", "deprecated alias kept in art_core.auto_trajectory"),
    ("art.auto_trajectory", "capture_auto_trajectory"): ("art_core.capture:trajectory", "deprecated alias kept in art_core.auto_trajectory"),
}  # fmt: skip


def _resolve(path: str) -> Any:
    """`module:attr.attr` -> the object (AttributeError/ImportError when it is not there)."""
    module_name, _, attributes = path.partition(":")
    value: Any = importlib.import_module(module_name)
    for attribute in filter(None, attributes.split(".")):
        value = getattr(value, attribute)
    return value


def _ours(art_module: str, name: str) -> str:
    ours = MODULES[art_module]
    return f"{ours}.{name}" if ":" in ours else f"{ours}:{name}"


def classify(art_module: str, name: str) -> dict[str, str]:
    """One row: status, our path, note. Raises AssertionError for a name that is none of the three."""
    ours = _ours(art_module, name)
    try:
        found: Any = _resolve(ours)
    except (AttributeError, ImportError):
        found = None
    if (art_module, name) in MAPPED:
        target, note = MAPPED[(art_module, name)]
        _resolve(target)  # must import
        # The port rule holds for a mapped name too: `art.X.name` is `art_core.X.name`.
        assert found is not None and not isinstance(found, _refused_art_names.RefusedName), (
            f"{art_module}.{name} is mapped to {target} but does not resolve at {ours}"
        )
        if target.replace(":", ".") != ours.replace(":", "."):
            note += f"; `{ours.replace(':', '.')}` works too"
        return {"status": "mapped", "ours": target.replace(":", "."), "note": note}
    if found is not None and not isinstance(found, _refused_art_names.RefusedName):
        # Supported only if ART's documented calls of it bind here (test_art_docs_blocks.py).
        from tests.compat.test_art_docs_blocks import documented_call_failures

        failing = documented_call_failures(f"{art_module}.{name}")
        if failing:
            more = f"; and {len(failing) - 2} more" if len(failing) > 2 else ""
            note = "ART's documented calls that do not bind here: " + "; ".join(failing[:2]) + more
            return {"status": "partly", "ours": ours.replace(":", "."), "note": note}
        return {"status": "supported", "ours": ours.replace(":", "."), "note": ""}
    assert _refused_art_names.refused(art_module, name) is not None, (
        f"{art_module}.{name}: not at {ours}, not mapped, not refused"
    )
    assert isinstance(found, _refused_art_names.RefusedName), (
        f"{art_module}.{name} is refused but does not import from {ours}: serve "
        f"`_refused_art_names.REFUSED[{art_module!r}]` from {MODULES[art_module]} with "
        "`__getattr__ = _refused_art_names.module_getattr(...)`"
    )
    with pytest.raises(UnsupportedOptionError) as refusal:
        found()
    reason = _refused_art_names.REFUSED[art_module][name]
    assert reason in str(refusal.value)
    return {"status": "refused", "ours": ours.replace(":", "."), "note": reason}


def all_rows() -> list[tuple[str, str, dict[str, str]]]:
    modules = {**NAMES["modules"], **NAMES["earlier_modules"]}
    return [
        (module, name, classify(module, name))
        for module in modules
        for name in modules[module]["names"]
    ]


def render(rows: list[tuple[str, str, dict[str, str]]]) -> str:
    counts = {
        status: sum(row["status"] == status for _, _, row in rows)
        for status in ("supported", "partly", "mapped", "refused")
    }
    earlier = {name for module in NAMES["earlier_modules"].values() for name in module["names"]}
    lines = [
        START,
        f"{len(rows)} names ({len(rows) - len(earlier)} from ART 0.5.23, {len(earlier)} from earlier ART): "
        f"{counts['supported']} supported, {counts['mapped']} mapped, {counts['refused']} refused"
        + (
            f", {counts['partly']} partly (a documented call does not bind)."
            if counts["partly"]
            else "."
        ),
        "",
        "| ART name | status | ours | note |",
        "| --- | --- | --- | --- |",
    ]
    for module, name, row in rows:
        ours = f"`{row['ours']}`" if row["ours"].startswith("art") else row["ours"]
        note = row["note"].replace("|", "\\|")
        lines.append(f"| `{module}.{name}` | {row['status']} | {ours} | {note} |")
    lines.append(END)
    return "\n".join(lines)


def test_every_art_name_is_supported_mapped_or_refused_and_the_page_lists_them():
    table = render(all_rows())
    page = PAGE.read_text()
    before, _, rest = page.partition(START)
    _, _, after = rest.partition(END)
    generated = before + table + after
    if os.environ.get("ART_UPDATE_COMPAT") == "1":
        PAGE.write_text(generated)
        return
    assert page == generated, (
        "docs/art-compatibility.md differs from the generated table: refresh it with "
        "ART_UPDATE_COMPAT=1 .venv/bin/python -m pytest tests/compat/test_art_names.py"
    )


def test_the_name_list_says_where_it_came_from():
    assert "0.5.23" in NAMES["source"]["package"]
    assert len(NAMES["source"]["wheel_sha256"]) == 64
    assert set(NAMES["modules"]) | set(NAMES["earlier_modules"]) == set(MODULES)


def test_every_refusal_names_a_real_art_name():
    """No stale rows: each refused name is one ART 0.5.23 exports."""
    modules = NAMES["modules"]
    for art_module, names in _refused_art_names.REFUSED.items():
        assert set(names) <= set(modules[art_module]["names"]), art_module
