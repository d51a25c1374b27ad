"""Schemathesis over `/openapi.json`: generated requests, valid and invalid, against the real server.

Every operation is called with examples generated from its description, with and without the
API key; no answer may be a 5xx, and every answer must match the description (status, content
type, body schema). The run is bounded and deterministic (`derandomize`): the same requests
every time, a few per operation.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.support.adapters import tar_of
from tests.support.servers import RunningServer, running_server

API_KEY = "schemathesis-key"
# The engine routes' adapter upload is a tar archive: bytes, or archives of some files, some of
# them the adapter's own names, some a path out of the folder.
BINARY = {"type": "string", "format": "binary"}
TAR_MEMBERS = ["adapter_config.json", "adapter_model.safetensors", "../adapter_config.json", "x"]


schemathesis.openapi.media_type(
    "application/x-tar",
    st.binary(max_size=64)
    | st.builds(
        tar_of, st.dictionaries(st.sampled_from(TAR_MEMBERS), st.binary(max_size=64), max_size=3)
    ),
)
# A few examples per operation keep the whole run (18 operations, two servers) well under a
# minute on two cores; derandomized, so a failure found once is found every time.
EXAMPLES_PER_OPERATION = 5
FUZZED_PROJECT, FUZZED_MODEL = "fuzz", "target"
# A request the description allows may still be refused with a 400: the description cannot say
# which model names are served, how long the model's context is, or that a tool message needs
# `tool_call_id`. So "valid data accepted" is not checked; a 5xx, an invalid request accepted,
# or an answer that does not match its description all still fail.
NOT_EXPRESSIBLE = [schemathesis.checks.positive_data_acceptance]


@pytest.fixture(scope="module")
def short_context_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a 256-token context: a generated request without max_tokens (which
    generates to the end of the context), times n up to 64, stays a fraction of a second."""
    folder = tmp_path_factory.mktemp("short-context") / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    return folder


@pytest.fixture(scope="module", params=[None, API_KEY], ids=["open", "keyed"])
def fuzzed_server(
    request: pytest.FixtureRequest,
    short_context_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningServer]:
    """A server of its own (what the generated requests register and train stays here)."""
    with running_server(
        short_context_model,
        tmp_path_factory.mktemp("art-fuzzed"),
        api_key=request.param,
        replica_api=True,  # the engine routes another art-server decodes through
    ) as running:
        yield running


@pytest.fixture(scope="module")
def registered_model(fuzzed_server: RunningServer) -> None:
    """A model the training routes' generated requests are aimed at."""
    body = {"project": FUZZED_PROJECT, "name": FUZZED_MODEL, "base_model": "tiny"}
    response = httpx.post(
        f"{fuzzed_server.url}/v1/training/models",
        json=body,
        headers=fuzzed_server.headers(),
        timeout=60,
    )
    assert response.status_code == 200, response.text


def test_the_description_declares_bodies_errors_and_every_path_parameter(
    fuzzed_server: RunningServer,
):
    response = httpx.get(f"{fuzzed_server.url}/openapi.json", headers=fuzzed_server.headers())
    document = response.json()
    chat = document["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    request = document["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages", "temperature", "top_p", "seed"} <= set(request["properties"])
    assert "reasoning_effort" not in request["properties"]  # refused by name, not offered
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            label = f"{method.upper()} {path}"
            assert "422" not in operation["responses"], label  # validation answers 400
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{(\w+)}", path)), label
            if path == "/health":
                continue
            for status in ("400", "401", "404"):
                error = operation["responses"][status]["content"]["application/json"]["schema"]
                assert error == {"$ref": "#/components/schemas/ErrorResponse"}, label
            assert ("413" in operation["responses"]) == ("requestBody" in operation), label
            assert ("security" in operation) == (fuzzed_server.api_key is not None), label


@pytest.mark.usefixtures("registered_model")
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_generated_requests_get_no_5xx_and_match_the_description(
    fuzzed_server: RunningServer, mode: GenerationMode
):
    description = schemathesis.openapi.from_url(
        f"{fuzzed_server.url}/openapi.json", headers=fuzzed_server.headers()
    )
    operations = [result.ok() for result in description.get_all_operations()]
    assert len(operations) >= 18
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            derandomize=True,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def call(case) -> None:
            if mode is GenerationMode.POSITIVE:
                _aim_at_what_exists(case)
            case.call_and_validate(
                headers=fuzzed_server.headers(), timeout=60, excluded_checks=NOT_EXPRESSIBLE
            )

        try:
            call()
        except Unsatisfiable:
            # Without a body no request is invalid (any string is a valid path part), nor with
            # raw bytes (the adapter upload); an operation with a described body must get
            # invalid ones, so a lost body description fails.
            raw = all(body.definition["schema"] == BINARY for body in operation.body.items)
            assert mode is GenerationMode.NEGATIVE and raw, operation.label


def _aim_at_what_exists(case) -> None:
    """Name the served model and the registered one, so generated requests reach the sampler,
    the grammar compiler and the trainer's arithmetic instead of stopping at a 404."""
    if isinstance(case.body, dict):
        for field in ("model", "base_model"):
            if field in case.body:
                case.body[field] = "tiny"
    if case.path_parameters and {"project", "name"} <= set(case.path_parameters):
        case.path_parameters.update(project=FUZZED_PROJECT, name=FUZZED_MODEL)
    config = case.body.get("config") if isinstance(case.body, dict) else None
    if isinstance(config, dict):
        config.pop("review_hold_seconds", None)  # holds the step for a person, for up to a week
