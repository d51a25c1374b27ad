"""Backends for the client tests: the same suite runs against RemoteBackend and LocalBackend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import art_core as art
from tests.backend.conftest import RunningServer, start_server
from tests.core.scripted_judge import ScriptedJudge, start_scripted_judge


@pytest.fixture(scope="session")
def training_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """An art-server in this process (so tests can look inside), tiny model, no API key."""
    uv_server, thread, running = start_server(tiny_model_dir, tmp_path_factory.mktemp("art-train"))
    yield running
    uv_server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="session")
async def remote_backend(training_server: RunningServer) -> AsyncIterator[art.RemoteBackend]:
    backend = art.RemoteBackend(training_server.url)
    yield backend
    await backend.close()


@pytest.fixture(scope="session")
async def local_backend(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[art.LocalBackend]:
    """The backend in a child process (started by the first register)."""
    backend = art.LocalBackend(path=tmp_path_factory.mktemp("art-local"), dtype="float32")
    yield backend
    await backend.close()


@pytest.fixture(params=["remote", "local"])
def backend(request: pytest.FixtureRequest) -> art.RemoteBackend:
    return request.getfixturevalue(f"{request.param}_backend")


async def fresh_model(backend: art.Backend, tiny_model_dir: Path) -> art.TrainableModel:
    """A newly registered model with a unique name, on the tiny base model."""
    trainable = art.TrainableModel(
        name=f"m-{uuid.uuid4().hex[:8]}", project="tests", base_model=str(tiny_model_dir)
    )
    await trainable.register(backend)
    return trainable


@pytest.fixture
async def model(backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    """A freshly registered model, on each backend in turn."""
    return await fresh_model(backend, tiny_model_dir)


@pytest.fixture(scope="session")
def scripted_judge_server() -> Iterator[ScriptedJudge]:
    judge, server, thread = start_scripted_judge()
    yield judge
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def scripted_judge(scripted_judge_server: ScriptedJudge) -> Iterator[ScriptedJudge]:
    """The scripted judge with an empty script and no recorded requests."""
    scripted_judge_server.reset()
    yield scripted_judge_server
    scripted_judge_server.reset()


@pytest.fixture
def judge_model(scripted_judge: ScriptedJudge) -> art.Model:
    """The scripted judge as an art.Model, priced at $1/$4 per million tokens."""
    return art.Model(
        name="scripted-judge",
        base_url=scripted_judge.url,
        api_key="test-key",
        price=art.TokenPrice(input_per_million=1.0, output_per_million=4.0),
    )
