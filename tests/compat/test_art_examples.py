"""ART 0.5.23's examples ported by changing the import (`import art_core as art`), on the tiny
model, up to their first line that needs a GPU or a hosted service, which must say what to do.

The examples (OpenPipe/ART): examples/2048/2048.py, examples/tic_tac_toe/tic-tac-toe.py,
examples/temporal_clue/temporal-clue.py and the LangGraph email agent of
docs/integrations/langgraph-integration.mdx. What changed besides the import, and only that:
`base_model` is the tiny test model; `LocalBackend()` is the session's backend (float32, in a
temporary folder), except temporal-clue's `with LocalBackend() as backend:`, which starts its
own; the rollouts are one short completion each (the examples' game code is theirs, not the
port's), `max_tokens` kept small; loops run one step. docs/art-compatibility.md lists the lines.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import art_core as art
from art_core.local.backend import LocalBackend  # tic-tac-toe's `from art.local.backend import ...`

QUESTIONS = ["What is 1 + 1?", "Name a colour."]


async def one_turn(model: art.Model, prompt: str, **extra: Any) -> art.Trajectory:
    """An example's rollout, cut to one short turn (the examples call the model by its name)."""
    messages: art.Messages = [{"role": "user", "content": prompt}]
    completion = await model.openai_client().chat.completions.create(
        messages=messages, model=model.name, max_tokens=4, **extra
    )
    choice = completion.choices[0]
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=0.0)


async def gather(model: art.Model, per_group: int = 3) -> list[art.TrajectoryGroup]:
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(one_turn(model, q) for _ in range(per_group)) for q in QUESTIONS),
        pbar_desc="gather",
        max_exceptions=10,
    )
    for group in groups:  # rewards that differ, so that every group trains
        for index, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(index)
    return groups


# -------------------------------------------------------------------------------------- 2048


def test_internal_config_set_after_construction_is_applied_as_the_constructors():
    model = art.TrainableModel(name="003", project="2048", base_model="tiny")
    # To run on a T4, we need to override some config defaults.  (ART's lines, as they are)
    with pytest.warns(art.dev.IgnoredSettingWarning) as ignored:
        model._internal_config = art.dev.InternalModelConfig(
            init_args=art.dev.InitArgs(max_seq_length=8192),
            engine_args=art.dev.EngineArgs(
                enforce_eager=True, gpu_memory_utilization=0.8, num_scheduler_steps=1
            ),
        )
    assert model.engine_settings == {"max_length": 8192}
    assert model._internal_config is not None
    said = "\n".join(str(warning.message) for warning in ignored)
    for key in ("enforce_eager", "gpu_memory_utilization", "num_scheduler_steps"):
        assert f"engine_args.{key}" in said and "ignored here" in said

    model._internal_config = art.dev.InternalModelConfig(
        engine_args=art.dev.EngineArgs(dtype="float32", max_num_seqs=8),
        lora_config=art.dev.LoRAConfig(rank=4, alpha=8),
    )
    assert model.engine_settings == {"dtype": "float32", "max_batch_size": 8}
    assert (model.lora_config.r, model.lora_config.alpha) == (4, 8)
    with pytest.raises(art.UnsupportedOptionError, match=r"init_args\.load_in_4bit"):
        model._internal_config = {"init_args": {"load_in_4bit": True}}
    with pytest.raises(art.UnsupportedOptionError, match="one setting"):
        model._internal_config = {
            "init_args": {"max_seq_length": 8},
            "engine_args": {"max_model_len": 9},
        }


def test_placement_hints_warn_and_behaviour_keys_stay_refused():
    # temporal-clue's constructor line, and ART's dedicated-GPU placement.
    with pytest.warns(art.dev.IgnoredSettingWarning, match=r"init_args.gpu_memory_utilization"):
        art.TrainableModel(
            name="001",
            project="temporal-clue",
            base_model="tiny",
            _internal_config={"init_args": {"gpu_memory_utilization": 0.775}},
        )
    with pytest.warns(art.dev.IgnoredSettingWarning, match=r"--vllm-devices") as ignored:
        art.TrainableModel(
            name="a",
            base_model="tiny",
            _internal_config={"trainer_gpu_ids": [0], "inference_gpu_ids": [1]},
        )
    assert len(ignored) == 2
    for refused in ({"engine_args": {"quantization": "awq"}}, {"rollout_weights_mode": "merged"}):
        with pytest.raises(art.UnsupportedOptionError, match="not honoured"):
            art.TrainableModel(name="a", base_model="tiny", _internal_config=refused)  # type: ignore[arg-type]


def test_arts_dev_train_config_maps_warns_or_refuses_by_name():
    with pytest.warns(art.dev.IgnoredSettingWarning, match="micro_batch_tokens"):
        config = art.dev.train_config({"logprob_calculation_chunk_size": 8}, learning_rate=3e-5)
    assert config == art.TrainConfig(learning_rate=3e-5)
    config = art.dev.train_config(
        art.dev.TrainConfig(ppo=True, scale_rewards=False, packed_sequence_length=512, epsilon=0.3)
    )
    assert (config.loss, config.scale_rewards, config.max_length, config.epsilon) == (
        "ppo", "none", 512, 0.3,
    )  # fmt: skip
    options = art.dev.art_train_options({"ppo": True, "epsilon": 0.1}, {"learning_rate": 5e-5})
    assert options == {"learning_rate": 5e-5, "loss_fn": "ppo", "epsilon": 0.1}
    with pytest.raises(art.UnsupportedOptionError, match="epsilon given both"):
        art.dev.art_train_options({"epsilon": 0.1}, {"epsilon": 0.2})
    with pytest.raises(art.UnsupportedOptionError, match="normalize_by_length"):
        art.dev.train_config({"normalize_by_length": False})


async def test_2048_ported_runs_to_its_s3_lines_which_copy_to_any_fsspec_url(
    local_backend: art.LocalBackend,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    model = art.TrainableModel(name="003", project="2048", base_model=str(tiny_model_dir))
    with pytest.warns(art.dev.IgnoredSettingWarning):
        model._internal_config = art.dev.InternalModelConfig(
            init_args=art.dev.InitArgs(max_seq_length=8192),
            engine_args=art.dev.EngineArgs(
                enforce_eager=True, gpu_memory_utilization=0.8, num_scheduler_steps=1
            ),
        )
    backend = local_backend  # LocalBackend()

    # Without a bucket, the first S3 line says where the files are and what to pass.
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)
    with pytest.raises(art.UnsupportedOptionError, match=r"BACKUP_BUCKET.*2048/models/003"):
        await backend._experimental_pull_from_s3(model, verbose=True)

    bucket = tmp_path / "bucket"
    monkeypatch.setenv("BACKUP_BUCKET", bucket.as_uri())  # a file:// URL: any fsspec URL works
    await backend._experimental_pull_from_s3(model, verbose=True)  # nothing there yet
    await model.register(backend)
    for i in range(await model.get_step(), 1):
        train_groups = await gather(model)
        await model.delete_checkpoints()
        await backend._experimental_push_to_s3(model)
        with pytest.warns(art.dev.IgnoredSettingWarning, match="logprob_calculation_chunk_size"):
            result = await model.train(
                train_groups,
                config=art.TrainConfig(learning_rate=3e-5),
                _config={"logprob_calculation_chunk_size": 8},
            )
        assert result.step == i + 1
    await backend._experimental_push_to_s3(model)
    in_bucket = bucket / "2048" / "models" / "003" / "checkpoints"
    assert sorted(path.name for path in in_bucket.iterdir()) == ["0000", "0001"]

    # Pulled into another backend's folder (before registering there), step 1 only.
    other = art.LocalBackend(path=tmp_path / "other")
    copy = art.TrainableModel(name="003", project="2048", base_model=str(tiny_model_dir))
    await other._experimental_pull_from_s3(copy, only_step="latest")
    pulled = Path(other._path) / "2048" / "models" / "003" / "checkpoints"
    assert [path.name for path in pulled.iterdir()] == ["0001"]
    assert sorted(p.name for p in (pulled / "0001").iterdir()) == sorted(
        p.name for p in (in_bucket / "0001").iterdir()
    )
    with pytest.raises(art.UnsupportedOptionError, match=r"before model\.register"):
        await backend._experimental_pull_from_s3(model)


async def test_a_models_max_seq_length_is_its_longest_trained_row(
    local_backend: art.LocalBackend, tiny_model_dir: Path
):
    model = art.TrainableModel(
        name="short-rows",
        project="2048",
        base_model=str(tiny_model_dir),
        _internal_config={"init_args": {"max_seq_length": 4}},
    )
    await model.register(local_backend)
    groups = await gather(model)
    result = await model.train(groups)  # every row is longer than 4 tokens: none trains
    assert result.step == 0 and result.metrics["dropped/over_length"] == 6
    result = await model.train(groups, max_length=4096)  # a step's own max_length wins
    assert result.step == 1
    with pytest.raises(art.UnsupportedOptionError, match=r"before `model\.register"):
        model._internal_config = {"init_args": {"max_seq_length": 8}}


# ------------------------------------------------------------------------------- tic-tac-toe


async def test_tic_tac_toe_ported_runs_to_its_s3_line(
    local_backend: art.LocalBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)
    assert isinstance(local_backend, LocalBackend)
    backend = local_backend  # LocalBackend()
    model = art.TrainableModel(
        name="llama-8b-007", project="tic-tac-toe", base_model=str(tiny_model_dir)
    )
    await model.register(backend)
    for _ in range(await model.get_step(), 1):
        train_groups = await gather(model)
        await model.delete_checkpoints()
        await model.train(train_groups, config=art.TrainConfig(learning_rate=5e-5))
        with pytest.raises(art.UnsupportedOptionError) as refusal:
            await backend._experimental_push_to_s3(model)
    message = str(refusal.value)
    assert "s3_bucket=" in message and "BACKUP_BUCKET" in message
    assert str(Path(backend._path) / "tic-tac-toe" / "models" / "llama-8b-007") in message
    with pytest.raises(art.UnsupportedOptionError, match="serves every step itself"):
        await backend._experimental_deploy(deploy_to="together", model=model, step=1)


# ---------------------------------------------------------------------------- temporal-clue


async def test_temporal_clue_ported_trains_with_the_backends_with_block(
    tiny_model_dir: Path, tmp_path: Path, engine_options: dict, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)
    vllm = engine_options.get("vllm")
    with pytest.warns(art.dev.IgnoredSettingWarning):
        model = art.TrainableModel(
            name="001",
            project="temporal-clue",
            base_model=str(tiny_model_dir),
            _internal_config={"init_args": {"gpu_memory_utilization": 0.775}},
        )
    with LocalBackend(
        path=tmp_path / ".art",
        dtype="float32",
        extra_args=["--engine", "vllm", "--vllm-url", vllm.url] if vllm else None,
    ) as backend:
        await model.register(backend)
        for i in range(await model.get_step(), 1):
            val_groups = await gather(model, per_group=2)
            train_groups = await gather(model)
            await model.log(val_groups)
            await model.delete_checkpoints()
            result = await backend.train(model, train_groups, learning_rate=5e-5)
            await model.log(train_groups, metrics=result.metrics, step=result.step, split="train")
            assert result.step == i + 1
        process = backend.process
    assert process is not None and process.poll() is not None  # the block stopped the backend


# -------------------------------------------------------------------------------- LangGraph


async def test_langgraph_email_agent_ported_runs_to_its_ruler_line(
    local_backend: art.LocalBackend, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    from langchain_core.messages import HumanMessage, SystemMessage

    from art_core.langgraph import init_chat_model, wrap_rollout
    from art_core.rewards import ruler_score_group
    from art_core.utils import iterate_dataset

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = art.TrainableModel(name="email-agent", project="email", base_model=str(tiny_model_dir))
    backend = local_backend  # LocalBackend()

    async def rollout(model: art.Model, question: str) -> art.Trajectory:
        traj = art.Trajectory(reward=0.0, messages_and_choices=[], metadata={"q": question})
        chat_model = init_chat_model(model.get_inference_name(), temperature=1.0, max_tokens=4)
        await chat_model.ainvoke([SystemMessage(content="Answer."), HumanMessage(content=question)])
        return traj

    await model.register(backend)
    for batch in iterate_dataset(QUESTIONS, groups_per_step=2, num_epochs=1, initial_step=0):
        groups = [
            art.TrajectoryGroup([wrap_rollout(model, rollout)(model, q) for _ in range(3)])
            for q in batch.items
        ]
        finished_groups = await art.gather_trajectory_groups(groups, pbar_desc="gather")
        with pytest.raises(art.ModelConfigError, match="OPENAI_API_KEY"):
            await ruler_score_group(finished_groups[0], "openai/o4-mini")
        for group in finished_groups:
            for index, trajectory in enumerate(group.trajectories):
                trajectory.reward = float(index)
        with pytest.warns(art.dev.IgnoredSettingWarning):
            await model.train(
                finished_groups,
                config=art.TrainConfig(learning_rate=1e-5),
                _config={"logprob_calculation_chunk_size": 8},
            )
    assert model.step == 1
    # ART's other training form takes _config as well, through the same mapping.
    groups = await gather(model)
    result = await backend.train(
        model, groups, learning_rate=1e-5, _config=art.dev.TrainConfig(precalculate_logprobs=False)
    )
    assert result.step == 2


# ------------------------------------------------------------------ names at ART's paths


def test_the_names_the_issue_found_missing_resolve_at_arts_paths():
    from art_core import PipelineRuntimeConfig
    from art_core.errors import ARTError  # type: ignore[attr-defined]
    from art_core.langgraph import init_chat_model, wrap_rollout
    from art_core.mcp import MCPTool, complete_task_tool, generate_scenarios
    from art_core.trajectories import get_messages
    from art_core.types import Messages  # type: ignore[attr-defined]

    assert ARTError is art.ArtError and Messages is art.Messages
    assert callable(init_chat_model) and callable(wrap_rollout) and callable(generate_scenarios)
    assert MCPTool.__name__ == "McpTool" and complete_task_tool["function"]["name"]
    assert PipelineRuntimeConfig is art.pipeline_trainer.PipelineRuntimeConfig
    choice_free = [{"role": "user", "content": "hi"}]
    assert get_messages(choice_free) == choice_free
    with pytest.warns(DeprecationWarning):
        assert art.auto_trajectory() is None  # ART's old name, outside any capture scope
    assert callable(art.capture_auto_trajectory)


@pytest.mark.parametrize(("module", "extra"), [("langgraph", "langgraph"), ("mcp", "mcp")])
def test_a_missing_integration_names_its_extra(
    module: str, extra: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, f"art_{module}", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=rf"pip install 'art-trainer\[{extra}\]'"):
        exec(f"from art_core.{module} import generate_scenarios, init_chat_model", {})


# ---------------------------------------------------------------- hosted services, answered


async def test_s3_w_and_b_and_path_answer_with_where_the_files_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from art_core.utils.deployment import deploy_wandb

    model = art.TrainableModel(name="m", project="p", base_model="tiny")
    remote = art.RemoteBackend("http://127.0.0.1:9")
    for helper in (remote._experimental_push_to_s3, remote._experimental_pull_from_s3):
        with pytest.raises(art.UnsupportedOptionError, match=r"p/models/m/.*LocalBackend"):
            await helper(model, s3_bucket="bucket")
    with pytest.raises(art.UnsupportedOptionError, match="--path"):
        remote._path  # noqa: B018
    local = art.LocalBackend(path=tmp_path)
    assert local._path == str(tmp_path.resolve())  # ART's attribute: the backend's folder
    with pytest.raises(art.UnsupportedOptionError, match=r"/tmp/ckpt.*wandb.Artifact"):
        deploy_wandb(model, "/tmp/ckpt", 3)
    (tmp_path / "p" / "models" / "m").mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if fsspec were not installed
    with pytest.raises(art.UnsupportedOptionError, match=r"pip install fsspec s3fs.*aws s3 sync"):
        await local._experimental_push_to_s3(model, s3_bucket="bucket")
