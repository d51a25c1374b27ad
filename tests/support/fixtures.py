"""The shared fixtures, registered for every test folder by tests/conftest.py (pytest_plugins).

The tiny model, the servers on 127.0.0.1 (serving, keyed, training), the two backends, the
scripted judge. Helpers that are not fixtures live beside this file and are imported directly.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import art_core as art
from tests.support.models import fresh_model
from tests.support.scripted_judge import ScriptedJudge, start_scripted_judge
from tests.support.servers import RunningServer, running_server
from tests.support.tiny_model import VLLM_SHAPE, build_tiny_model

# ------------------------------------------------------------------------------ the tiny model


@pytest.fixture(scope="session")
def test_engine(pytestconfig: pytest.Config) -> str:
    """The engine the test servers run: `pytest --engine vllm` (make test-vllm) or torch."""
    return str(pytestconfig.getoption("--engine"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, test_engine: str) -> Path:
    """A folder with a tiny random Llama model and a ChatML tokenizer, built once per session."""
    shape = VLLM_SHAPE if test_engine == "vllm" else {}
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), **shape)


@pytest.fixture(scope="session")
def vllm_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM server for the session (about a minute to start), shared by every test server:
    each attaches with --vllm-url and prefixes its adapters' names."""
    from art_backend.testing import VllmProcess, VllmSettings, find_vllm_python

    python = find_vllm_python()
    if python is None:
        pytest.fail("--engine vllm needs ART_VLLM_PYTHON (make test-vllm sets it)")
    settings = VllmSettings(
        python=python,
        model=str(tiny_model_dir),
        dtype="float32",
        context_length=2048,
        kv_cache_gb=1,
        log_path=tmp_path_factory.mktemp("vllm") / "vllm.log",
    )
    process = VllmProcess(settings)
    process.start()
    try:
        yield process.base_url
    finally:
        process.stop()


@pytest.fixture(scope="session")
def engine_options(request: pytest.FixtureRequest, test_engine: str) -> dict:
    """What a test server is built with to run on the session's engine."""
    if test_engine != "vllm":
        return {}
    from art_backend.engines._vllm_options import VllmOptions

    return {"engine": "vllm", "vllm": VllmOptions(url=request.getfixturevalue("vllm_url"))}


@pytest.fixture(scope="session", autouse=True)
def _judge_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Judge and generator answers cached by default go to a temporary folder, not ~/.cache."""
    previous = os.environ.get("ART_CACHE_DIR")
    os.environ["ART_CACHE_DIR"] = str(tmp_path_factory.mktemp("art-cache"))
    yield
    if previous is None:
        os.environ.pop("ART_CACHE_DIR", None)
    else:
        os.environ["ART_CACHE_DIR"] = previous


# --------------------------------------------------------------------------------- the servers


@pytest.fixture(scope="session")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> Iterator[RunningServer]:
    """The tiny model served without an API key."""
    path = tmp_path_factory.mktemp("art")
    with running_server(tiny_model_dir, path, **engine_options) as running:
        yield running


@pytest.fixture(scope="session")
def keyed_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> Iterator[RunningServer]:
    """The tiny model served with an API key."""
    path = tmp_path_factory.mktemp("art-keyed")
    with running_server(tiny_model_dir, path, api_key="secret-key", **engine_options) as running:
        yield running


@pytest.fixture
def client(server: RunningServer):
    """The real openai SDK pointed at the test server."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def async_client(server: RunningServer):
    import openai

    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


# ------------------------------------------------------------- backends and the scripted judge


@pytest.fixture(scope="module")
def training_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> Iterator[RunningServer]:
    """An art-server in this process (so tests can look inside), tiny model, no API key; one per
    test file: every registered model keeps an adapter in the server's one PEFT model, and PEFT's
    adapter operations walk all of them (a step took 0.1 s on a fresh server, 3 s beside 100
    models), so a session-long server made the suite's last training tests the slowest."""
    path = tmp_path_factory.mktemp("art-train")
    with running_server(tiny_model_dir, path, **engine_options) as running:
        yield running


@pytest.fixture(scope="module")
async def remote_backend(training_server: RunningServer) -> AsyncIterator[art.RemoteBackend]:
    backend = art.RemoteBackend(training_server.url)
    yield backend
    await backend.close()


@pytest.fixture(scope="session")
async def local_backend(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> AsyncIterator[art.LocalBackend]:
    """The backend in a child process (started by the first register)."""
    vllm = engine_options.get("vllm")
    backend = art.LocalBackend(
        path=tmp_path_factory.mktemp("art-local"),
        dtype="float32",
        extra_args=["--engine", "vllm", "--vllm-url", vllm.url] if vllm else None,
    )
    yield backend
    await backend.close()


@pytest.fixture(params=["remote", "local"])
def backend(request: pytest.FixtureRequest) -> art.RemoteBackend:
    return request.getfixturevalue(f"{request.param}_backend")


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
