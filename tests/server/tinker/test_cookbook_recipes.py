"""The Tinker cookbook's own recipes (tinker-cookbook, `make test` installs it) run through
their entry points against a real server on the tiny model, a few steps each, with local data
(examples/tinker_cookbook_recipes.py; on SmolLM2 in BENCHMARKS.md). Each test checks the steps
ran and logged, and one thing the recipe's numbers show only when the server serves it right:
the tiny model runs in float32, where the sampler's logprobs are the trainer's."""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

tinker = pytest.importorskip("tinker", reason="the tinker SDK is not installed: pip install tinker")
pytest.importorskip(
    "tinker_cookbook", reason="tinker-cookbook is not installed: make .venv/.installed-cookbook"
)

from tests.support.servers import RunningServer, running_tinker_server  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tinker_cookbook_recipes.py"
API_KEY = "tml-cookbook-key"
STEPS = 3


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_tinker_server(
        tiny_model_dir, tmp_path_factory.mktemp("art-cookbook"), api_key=API_KEY
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def _recipe_log_files_closed() -> Iterator[None]:
    """A recipe adds file handlers for its log folder to the process's loggers; they are closed
    and removed after the test (the folder goes with the test's, and a later test's logging
    would fail writing to it: it failed every test after these in one run)."""
    loggers = [logging.getLogger(), *map(logging.getLogger, logging.root.manager.loggerDict)]
    before = {id(logger): list(logger.handlers) for logger in loggers}
    yield
    for logger in [logging.getLogger(), *map(logging.getLogger, logging.root.manager.loggerDict)]:
        for handler in list(logger.handlers):
            if handler not in before.get(id(logger), []):
                logger.removeHandler(handler)
                handler.close()


@pytest.fixture(scope="module")
def recipes() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("tinker_cookbook_recipes", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tinker_cookbook_recipes"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["tinker_cookbook_recipes"]


@pytest.fixture
def run_recipe(
    recipes: ModuleType,
    server: RunningServer,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], list[dict]]:
    """Runs a recipe for STEPS steps of 2 (sequences, pairs or groups); its steps' metric rows."""
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)

    def run(name: str) -> list[dict]:
        # rank 32 for all: distillation's own 128 is refused as wider than the tiny model (64)
        settings = recipes.RecipeRun(
            server.url, str(tiny_model_dir), tmp_path / name,
            steps=STEPS, batch=2, max_tokens=8, lora_rank=32,
        )  # fmt: skip
        recipes.RECIPES[name](settings)
        rows = recipes.metrics(settings.log_path)
        # RL recipes end with a row of token counts alone; each step's row has its progress.
        steps = [row for row in rows if "progress" in row or "progress/batch" in row]
        assert [row["step"] for row in steps] == list(range(STEPS)), rows
        return steps

    return run


def test_chat_sl_trains_and_its_final_checkpoint_is_the_servers(
    run_recipe: Callable[[str], list[dict]], server: RunningServer, tmp_path: Path
):
    rows = run_recipe("chat_sl")
    assert all(row["num_loss_tokens"] > 0 and math.isfinite(row["train_mean_nll"]) for row in rows)
    final = json.loads((tmp_path / "chat_sl" / "checkpoints.jsonl").read_text().splitlines()[-1])
    # The paths the recipe recorded name checkpoints the server lists for the run.
    run_id = final["state_path"].removeprefix("tinker://").split("/")[0]
    rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
    listed = {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert {final["state_path"], final["sampler_path"]} <= listed


def test_math_rl_trains_with_stable_reinforce_on_the_samplers_own_logprobs(
    run_recipe: Callable[[str], list[dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv

    # The random tiny model never answers right: alternate the verdict so every group has a
    # spread of rewards, and every step trains.
    verdicts = itertools.cycle([True, False])
    monkeypatch.setattr(ArithmeticEnv, "check_answer", lambda self, sample: next(verdicts))
    rows = run_recipe("math_rl")
    config = json.loads((tmp_path / "math_rl" / "config.json").read_text())
    assert config["loss_fn"] == "stable_reinforce"
    trained = [row for row in rows if "grad_norm" in row]
    assert len(trained) == STEPS and all(row["grad_norm"] > 0 for row in trained)
    # The recipe's own check that the sampler's logprobs are the trainer's (float32: equal).
    assert all(row["optim/kl_sample_train_v1"] < 1e-4 for row in trained), trained


def test_dpo_starts_at_ln2_and_its_policy_moves_from_the_reference(
    run_recipe: Callable[[str], list[dict]],
):
    rows = run_recipe("dpo")
    # Before any update the reference sampler (compute_logprobs) and the policy's forward are
    # the same model: every margin is 0 and the loss is exactly -log sigmoid(0) = ln 2.
    assert rows[0]["dpo_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert abs(rows[0]["margin"]) < 1e-4
    assert abs(rows[-1]["margin"]) > 10 * abs(rows[0]["margin"])


def test_distillation_from_the_served_base_model_starts_at_zero_kl(
    run_recipe: Callable[[str], list[dict]],
):
    rows = run_recipe("distillation")
    # The teacher is the base model, the student its fresh LoRA (zero B): the teacher's
    # compute_logprobs of the student's samples are the student's own at first, then the
    # student's updates take it away (the recipe's estimate of the KL has either sign).
    kl = [abs(row["teacher_kl"]) for row in rows]
    assert kl[0] < 1e-5 and max(kl[1:]) > 10 * kl[0], kl
