"""ART's own documentation and example code, block by block, against art_core.

`art_docs_blocks.json` records every code block of ART's docs site and of its `examples/` and
`dev/` scripts: the ART names each imports and calls, with how many positional arguments and
which keywords (`python -m tests.support.art_blocks /path/to/art-src` rewrites it). Here:

- every documented call of a name the names table (test_art_names.py) marks supported or mapped
  binds to our object's signature, methods included (`model.train(groups, config=...)` against
  `art_core.TrainableModel.train`), so a supported name is one whose documented calls run;
- every name a block imports from ART imports from art_core, or is refused by name;
- docs/art-docs-blocks.md, each block's status derived from the above, is up to date: refresh it
  with `ART_UPDATE_COMPAT=1 .venv/bin/python -m pytest tests/compat/test_art_docs_blocks.py`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import typing
from collections import defaultdict
from pathlib import Path
from typing import Any

import pydantic
import pytest

import art_core as art
from art_core import _refused_art_names
from art_core import dev as art_dev
from tests.compat.test_art_names import MAPPED, MODULES, NAMES, all_rows
from tests.support import art_blocks

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PAGE = ROOT / "docs" / "art-docs-blocks.md"
BLOCKS = json.loads((HERE / "art_docs_blocks.json").read_text())
PYTHON = {"python", "py", "python3", "py3"}
MAX_NAMES_SHOWN = 8  # per row of the page, to keep rows short
ART_REPOSITORY = "https://github.com/OpenPipe/ART"

# ART's engine internals: not client API (the names list leaves them out), nothing of them here.
ENGINE_INTERNALS = (
    "art.megatron",
    "art.unsloth",
    "art.vllm",
    "art.preprocessing",
    "art.transformers",
    "art.distributed",
    "art.tau_bench",
    "art.test",
    "art.skills",
    "art.trainer_rank",  # the trainer process's own commands
    "art.multidevice",  # ART before 0.5's multi-GPU runtime
    "art.config",
    "art.local.service",
    "art.local.state",
    "art.local.train",
    "art.local.vllm",
    "art.dev.model.get_model_config",
)

# Blocks that tests run (with the import changed), by (path, line): the test and the block's sha.
_PAGES = "docs/src/content/docs"
_RULER = "tests/core/test_ruler_art_signature.py"
RUN_IN_TESTS: dict[tuple[str, int], tuple[str, str]] = {
    (f"{_PAGES}/fundamentals/ruler.mdx", 69): (_RULER, "1a7fbc15e262"),  # the joke example
    (f"{_PAGES}/fundamentals/ruler.mdx", 185): (_RULER, "d619fcbe7b42"),  # extra LiteLLM params
    (f"{_PAGES}/fundamentals/ruler.mdx", 205): (_RULER, "affeaadd37f5"),  # custom rubric
    (f"{_PAGES}/fundamentals/ruler.mdx", 223): (_RULER, "24a33905c84b"),  # raw message lists
    (f"{_PAGES}/features/mcp-rl.mdx", 32): ("tests/mcp/test_art_generate_scenarios.py", "03a6d582db1e"),
    (f"{_PAGES}/fundamentals/sft-training.mdx", 130): ("tests/core/test_sft_file.py", "8f0a4974c628"),
}  # fmt: skip

# ART names its docs or examples use that are not served here, and why (a test checks each is
# still used and still missing, so the list shrinks as they are served).
_BEFORE_0_5 = "ART's name before 0.5 (now art.LocalBackend); not served here"
_GONE = "not in ART 0.5.23 (an example older than it); not served here"
_MAIN = "ART main (after 0.5.23)"
KNOWN_GAPS: dict[str, str] = {
    "art.LocalAPI": _BEFORE_0_5,
    "art.local.LocalAPI": _BEFORE_0_5,
    "art.LinearTemperatureAnnealer": _GONE,
    "art.TuneConfig": _GONE,
    "art.SkypilotAPI": _GONE,
    "art.API": _GONE,
    "art.dev.TorchtuneArgs": _GONE,
    "art.types.TuneConfig": _GONE,
    "art.Model.delete_checkpoints": "ART 0.5.23's Model has none either: TrainableModel.delete_checkpoints",
    "art.TrainableModel.set_temperature_annealer": _GONE,
    "art.UnslothAPI": _GONE,
    "art.local.backend.LocalBackend.down": _GONE,
    "art.utils.get_trajectory_messages": _GONE + ": art.Trajectory.messages() here",
    "art.skypilot": _GONE + ": clusters here are docs/cluster.md",
    "art.TrainingObjectives": f"{_MAIN}: on-policy distillation is not served here",
    "art.distill": f"{_MAIN}: on-policy distillation is not served here",
    "art.verifiers": f"{_MAIN}: the verifiers integration is not served here",
    "art.metrics": "ART 0.5.23's API cost tracking (art.metrics) is not served here",
    "art.utils.benchmarking": "ART 0.5.23's benchmark tables of its own output folders: not served here",
    "art.utils.benchmark_rollout": "ART 0.5.23's benchmark helper: not served here (run the rollouts with art.gather_trajectories)",
    "art.utils.get_repo_root_path": "ART 0.5.23's helper locating ART's own checkout: not served here",
}  # fmt: skip

# Documented calls that do not bind on ART 0.5.23 either (the example predates a change):
# (ART name, keyword; "" for any call) -> why. They do not count against a name's support.
STALE_IN_ART: dict[tuple[str, str], str] = {
    ("art.utils.iterate_dataset", "initial_iteration"): "ART 0.5.23's iterate_dataset takes initial_step",
    ("art.TrainableModel.train", "trajectory_groups"): "ART 0.5.23's TrainableModel has no train(); ART before 0.5's took trajectory_groups",
    ("art.gather_trajectories", "stream_chat_completions"): "not in ART 0.5.23",
    ("art.gather_trajectories", "return_exceptions"): "not in ART 0.5.23 (max_exceptions)",
    ("art.dev.InternalModelConfig", "torchtune_args"): "not in ART 0.5.23",
    ("art.dev.TrainConfig", "enable_assistant_message_training"): "not in ART 0.5.23",
}  # fmt: skip

# Supported names with a documented call that does not bind here, not fixed yet: the table and
# the page say so (test_art_names reads documented_call_failures); the binding test xfails them.
NOT_YET: dict[str, str] = {
    "art.Trajectory": "ART's Trajectory ignores unknown keywords (pydantic's default), ours refuses them "
    "by name: `Trajectory(scenario=...)` in examples/just-the-facts",
}


# ------------------------------------------------------------------ names, ours, and binding


@functools.cache
def table() -> dict[str, dict[str, str]]:
    """`art.module.Name` -> its row of the names table (status, ours, note)."""
    return {f"{module}.{name}": row for module, name, row in all_rows()}


def _listed_names() -> dict[str, set[str]]:
    modules = {**NAMES["modules"], **NAMES["earlier_modules"]}
    return {module: set(entry["names"]) for module, entry in modules.items()}


def locate(art_name: str) -> tuple[str | None, list[str]]:
    """(`module.Name` of the names table, the attributes after it), the longest module first:
    `art.TrainableModel.train` -> (`art.TrainableModel`, [`train`]); (None, []) when unlisted."""
    parts = art_name.split(".")
    listed = _listed_names()
    for split in range(len(parts) - 1, 0, -1):
        module, name = ".".join(parts[:split]), parts[split]
        if name in listed.get(module, ()):
            return f"{module}.{name}", parts[split + 1 :]
    return None, []


def resolve(dotted: str) -> Any:
    """`package.module.Attr.attr` -> the object, as `from package.module import Attr` finds it:
    an attribute before a submodule of the same name (`art_core.rewards.ruler` is the function).
    A refused name stands for everything under it."""
    parts = dotted.split(".")
    value: Any = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], start=2):
        if isinstance(value, _refused_art_names.RefusedName):
            return value
        if hasattr(value, part):
            value = getattr(value, part)
        elif inspect.ismodule(value):
            value = importlib.import_module(".".join(parts[:depth]))
        else:
            raise AttributeError(f"{'.'.join(parts[: depth - 1])} has no attribute {part!r}")
    return value


def ours(art_name: str) -> tuple[Any, str]:
    """Our object for an ART name and the path it was found at (mapped names at their target)."""
    key, rest = locate(art_name)
    if key is None:
        path = "art_core" + art_name.removeprefix("art")
        return resolve(path), path
    module, _, name = key.rpartition(".")
    target = MAPPED.get((module, name), (None, ""))[0]
    base = target.replace(":", ".") if target else _ours_path(module, name)
    path = ".".join([base, *rest])
    return resolve(path), path


def _ours_path(module: str, name: str) -> str:
    return f"{MODULES[module].replace(':', '.')}.{name}"


def _needs_self(path: str) -> bool:
    """Whether `path` names a method of a class (or of an alias's class: `Messages` is a list),
    which the documented call calls on an instance."""
    owner_path, _, attribute = path.rpartition(".")
    try:
        owner = resolve(owner_path)
    except (ImportError, AttributeError):
        return False
    owner = typing.get_origin(owner) or owner
    method = inspect.getattr_static(owner, attribute, None)
    return isinstance(owner, type) and (
        inspect.isfunction(method) or inspect.ismethoddescriptor(method)
    )


def _warned_keys(typed_dict: type) -> set[str]:
    """The keys of an `art.dev` section its TypedDict leaves out but the model accepts, warning
    they are ignored (`art_core.dev.PLACEMENT_KEYS`: ART's vLLM sizing and placement options)."""
    sections = {
        art_dev.EngineArgs: "engine_args",
        art_dev.InitArgs: "init_args",
        art_dev.InternalModelConfig: "",
    }
    section = sections.get(typed_dict)
    return set(art_dev.PLACEMENT_KEYS[section]) if section is not None else set()


def bind_error(obj: Any, path: str, call: dict[str, Any]) -> str | None:
    """Why `call` (its positional count and keywords) does not bind to `obj`, or None."""
    if call["star_args"] or call["star_kwargs"] or isinstance(obj, _refused_art_names.RefusedName):
        return None
    keywords = set(call["keywords"])
    if isinstance(obj, type) and typing.is_typeddict(obj):
        accepted = obj.__required_keys__ | obj.__optional_keys__ | _warned_keys(obj)
        unknown = keywords - accepted
        return f"{obj.__name__} has no keys {sorted(unknown)}" if unknown else None
    if (
        isinstance(obj, type)
        and issubclass(obj, pydantic.BaseModel)
        and obj.__init__ is pydantic.BaseModel.__init__
    ):
        if call["positional"]:
            return (
                f"{obj.__name__} takes keywords only, not {call['positional']} positional arguments"
            )
        if obj.model_config.get("extra") == "allow":
            return None
        fields = {
            alias
            for name, field in obj.model_fields.items()
            for alias in (name, field.alias)
            if alias
        }
        unknown = keywords - fields
        return f"{obj.__name__} has no fields {sorted(unknown)}" if unknown else None
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError) as error:
        return f"{path} has no signature: {error}"
    placeholders = [object()] * (call["positional"] + _needs_self(path))
    try:
        signature.bind(*placeholders, **dict.fromkeys(keywords, object()))
    except TypeError as error:
        return str(error)
    return None


def blocks() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every recorded (source, block)."""
    return [(source, block) for source in BLOCKS["sources"] for block in source["blocks"]]


def names_used(block: dict[str, Any]) -> list[str]:
    """The ART names a block imports or calls, once each, in order."""
    return list(
        dict.fromkeys([*block.get("art_imports", []), *(c["name"] for c in block.get("calls", []))])
    )


def calls_by_name() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every recorded call, by ART name, with its `path:line` label; not the calls of a block
    that drives ART's engine internals (they configure that engine, which is not served)."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for source, block in blocks():
        if any(engine_internal(name) for name in names_used(block)):
            continue
        for call in block.get("calls", []):
            found[call["name"]].append((_label(source, block, call["line"]), call))
    return found


def _label(source: dict[str, Any], block: dict[str, Any], line: int) -> str:
    if source["form"] == "cells":
        return f"{source['path']} cell {block['line']} line {line}"
    return f"{source['path']}:{line}"


def stale_in_art(art_name: str, call: dict[str, Any]) -> str | None:
    """Why this call would not bind on ART 0.5.23 either, if it would not."""
    return next(
        (
            why
            for (name, kw), why in STALE_IN_ART.items()
            if name == art_name and (not kw or kw in call["keywords"])
        ),
        None,
    )


def known_gap(art_name: str) -> str | None:
    """The reason an ART name (or the module or class it is under) is not served, if listed."""
    parts = art_name.split(".")
    return next(
        (
            KNOWN_GAPS[".".join(parts[:k])]
            for k in range(len(parts), 0, -1)
            if ".".join(parts[:k]) in KNOWN_GAPS
        ),
        None,
    )


def gap_root(art_name: str) -> str:
    """The KNOWN_GAPS entry an ART name is under (`art.distill` for `art.distill.Loss`), or itself."""
    parts = art_name.split(".")
    prefixes = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    return next((prefix for prefix in prefixes if prefix in KNOWN_GAPS), art_name)


def engine_internal(art_name: str) -> bool:
    """Whether an ART name is under one of ART's engine modules."""
    return any(
        art_name == module or art_name.startswith(f"{module}.") for module in ENGINE_INTERNALS
    )


def call_failure(art_name: str, call: dict[str, Any]) -> str | None:
    """Why this documented call would not run here (no such object, or it does not bind)."""
    try:
        obj, path = ours(art_name)
    except (ImportError, AttributeError) as error:
        return f"{art_name} does not resolve under art_core ({error})"
    if isinstance(obj, _refused_art_names.RefusedName):
        return None
    return bind_error(obj, path, call)


@functools.cache
def documented_call_failures(table_name: str) -> tuple[str, ...]:
    """`path:line: why` for each documented call of `table_name` (a names-table name: its own
    calls and its methods') that does not bind here, leaving out the names KNOWN_GAPS lists as
    not ART 0.5.23's or not served. test_art_names' table reads this."""
    failures = []
    for art_name, calls in calls_by_name().items():
        if locate(art_name)[0] != table_name or known_gap(art_name):
            continue
        for label, call in calls:
            failure = None if stale_in_art(art_name, call) else call_failure(art_name, call)
            if failure:
                failures.append(f"{label}: {failure}")
    return tuple(failures)


# ------------------------------------------------------------------ each block's status


def name_status(art_name: str) -> tuple[str, str]:
    """(supported | partly | mapped | refused | missing, the note) for an ART name a block uses:
    a names-table name's row (a method: its class's, where our class has the method)."""
    if engine_internal(art_name):
        return "refused", "ART's engine internals, not client API: art-server runs its own engine"
    key, rest = locate(art_name)
    if key is not None and (not rest or table()[key]["status"] == "refused"):
        row = table()[key]
        return row["status"], row["note"]
    try:
        obj, _ = ours(art_name)
    except (ImportError, AttributeError):
        return "missing", known_gap(art_name) or "not under art_core"
    if isinstance(obj, _refused_art_names.RefusedName):
        return "refused", obj.message
    if key is not None:
        return table()[key]["status"], table()[key]["note"]
    return "supported", ""


# ------------------------------------------------------------------ the tests


def _checked_names() -> list[str]:
    """The ART names called in the blocks whose calls are checked: supported or mapped here."""
    return sorted(
        name
        for name in calls_by_name()
        if not engine_internal(name)
        and not known_gap(name)
        and name_status(name)[0] in {"supported", "partly", "mapped"}
    )


@pytest.mark.parametrize(
    "art_name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[name]))
        if name in NOT_YET
        else name
        for name in _checked_names()
    ],
)
def test_every_documented_call_of_a_supported_or_mapped_name_binds_here(art_name: str):
    failures = [
        f"{label}: {failure}"
        for label, call in calls_by_name()[art_name]
        if not stale_in_art(art_name, call) and (failure := call_failure(art_name, call))
    ]
    assert not failures, f"ART's documented calls of {art_name} do not bind to ours:\n" + "\n".join(
        failures
    )


def _used_names() -> list[str]:
    found = {name for _, block in blocks() for name in names_used(block)}
    return sorted(name for name in found if not engine_internal(name) and not known_gap(name))


@pytest.mark.parametrize("art_name", _used_names())
def test_every_art_name_a_block_imports_or_calls_is_under_art_core_or_refused_by_name(
    art_name: str,
):
    users = [f"{s['path']}:{b['line']}" for s, b in blocks() if art_name in names_used(b)]
    status, note = name_status(art_name)
    assert status != "missing", f"{art_name} ({note}), used at {users[:3]}"
    try:
        ours(art_name)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{art_name} is {status} but does not resolve under art_core: {error}")


def test_every_known_gap_is_still_used_and_still_missing():
    """KNOWN_GAPS and STALE_IN_ART shrink as names are served and examples are fixed."""
    used = {name for _, block in blocks() for name in names_used(block)}
    for gap in KNOWN_GAPS:
        users = [name for name in used if name == gap or name.startswith(f"{gap}.")]
        assert users, f"KNOWN_GAPS names {gap}, which no block uses any more"
        assert all(name_status(name)[0] == "missing" for name in users), (
            f"{gap} is served now: drop it from KNOWN_GAPS"
        )
    for art_name, keyword in STALE_IN_ART:
        calls = [
            call
            for _, call in calls_by_name().get(art_name, [])
            if not keyword or keyword in call["keywords"]
        ]
        assert calls and all(call_failure(art_name, call) for call in calls), (art_name, keyword)


async def test_a_prompted_models_step_is_zero_as_in_art():
    """ART's LangGraph page calls `await model.get_step()` on an `art.Model`."""
    assert await art.Model(name="judge", base_url="http://127.0.0.1:1/v1").get_step() == 0


def test_the_blocks_said_to_run_in_tests_are_recorded_and_named_there():
    recorded = {(source["path"], block["line"]): block for source, block in blocks()}
    for (path, line), (test_file, sha) in RUN_IN_TESTS.items():
        assert (path, line) in recorded, f"{path}:{line} is not a recorded block"
        assert recorded[(path, line)]["sha"] == sha, (
            f"{path}:{line} changed since {test_file} copied it"
        )
        assert Path(path).name in (ROOT / test_file).read_text(), (
            f"{test_file} does not name {path}"
        )


def test_the_blocks_page_is_up_to_date():
    from tests.compat.art_docs_page import render  # it reads this module's tables

    generated = render()
    if os.environ.get("ART_UPDATE_COMPAT") == "1":
        PAGE.write_text(generated)
        return
    assert PAGE.exists() and PAGE.read_text() == generated, (
        "docs/art-docs-blocks.md differs from the generated page: refresh it with "
        "ART_UPDATE_COMPAT=1 .venv/bin/python -m pytest tests/compat/test_art_docs_blocks.py"
    )


# ------------------------------------------------------------------ how blocks are read

PAGE_TEXT = """# A page

```bash
pip install openpipe-art
```

<Tabs>
  <Tab>
    ```python title="train.py"
    import art
    model = art.TrainableModel(name="m", project="p", base_model="b")
    ```
  </Tab>
</Tabs>

```python
await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
```
"""


def test_a_page_splits_into_its_fenced_blocks_with_language_and_line():
    found = [(block.line, block.language) for block in art_blocks.mdx_blocks(PAGE_TEXT)]
    assert found == [(3, "bash"), (9, "python"), (16, "python")]
    records = art_blocks.source_blocks("docs/page.mdx", PAGE_TEXT, "file")
    later = records[2]  # reads `art` and `model` as the page's earlier block left them
    assert [(c["name"], c["line"], c["positional"], c["keywords"]) for c in later["calls"]] == [
        ("art.TrainableModel.train", 17, 1, ["config"]),
        ("art.TrainConfig", 17, 0, ["learning_rate"]),
    ]


def test_a_receiver_is_typed_only_where_every_binding_of_its_name_agrees():
    source = """
from art.local import LocalBackend
import art as a
backend = LocalBackend(in_process=True)
async def rollout(model: a.TrainableModel, other, **kw):
    await model.openai_client()
    await other.train(*kw)
async def elsewhere(model):
    await backend.close()
for model in []:
    pass
"""
    record = art_blocks.analyse(source, "python", 0)
    assert record["art_imports"] == ["art.local.LocalBackend", "art"]
    assert [(c["name"], c["keywords"]) for c in record["calls"]] == [
        ("art.local.LocalBackend", ["in_process"]),
        ("art.local.LocalBackend.close", []),  # `model` is bound three ways: no type, no call
    ]
    assert art_blocks.analyse("await x(...", "python", 0)["parses"] is False
    assert "parses" not in art_blocks.analyse("pip install art", "bash", 0)


def test_a_notebooks_html_cell_is_not_python_and_a_cut_import_reads_as_its_module():
    cells = art_blocks.notebook_cells(
        "# %% cell 1\n%%html\n<style>\n# %% cell 2\n%%capture\nimport art\n"
    )
    assert [(cell.line, cell.language) for cell in cells] == [(1, "html"), (2, "python")]
    record = art_blocks.source_blocks(
        "dev/x.py", "import os\nfrom art.megatron.x import (  # noqa\n", "imports"
    )
    assert record[0]["parses"] and record[0]["art_imports"] == ["art.megatron.x"]
