"""Bad input gets an OpenAI-shaped 4xx that names the field; the server keeps serving."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}


def body(**fields) -> dict:
    return {"model": "tiny", "messages": USER, "max_tokens": 4, **fields}


# (request body, status, param, words the message must contain)
BAD_REQUESTS = [
    (body(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role", "role"),
    (body(messages=[]), 400, "messages", "at least 1"),
    (body(messages=[{"role": "user"}]), 400, "messages[0]", "content"),
    (body(messages=[{"role": "tool", "content": "x"}]), 400, "messages[0]", "tool_call_id"),
    (
        body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "messages[0].content",
        "text",
    ),
    (body(temperature=2.5), 400, "temperature", "less than or equal to 2"),
    (body(temperature=-1), 400, "temperature", "greater than or equal to 0"),
    (body(top_p=0), 400, "top_p", "greater than 0"),
    (body(top_p=1.5), 400, "top_p", "less than or equal to 1"),
    (body(max_tokens=0), 400, "max_tokens", "greater than or equal to 1"),
    (body(n=0), 400, "n", "greater than or equal to 1"),
    (body(n=65), 400, "n", "less than or equal to 64"),
    (body(top_logprobs=21, logprobs=True), 400, "top_logprobs", "less than or equal to 20"),
    (body(top_logprobs=2), 400, None, "logprobs"),
    (body(presence_penalty=3), 400, "presence_penalty", "less than or equal to 2"),
    (body(frequency_penalty=-3), 400, "frequency_penalty", "greater than or equal to -2"),
    (body(logit_bias={"5": 200}), 400, "logit_bias", "[-100, 100]"),
    (body(logit_bias={"abc": 1}), 400, "logit_bias", "token ids"),
    (body(logit_bias={"99999": 1}), 400, "logit_bias", "outside the vocabulary"),
    (body(stop=["a", "b", "c", "d", "e"]), 400, "stop", "at most 4"),
    (body(max_tokens=100_000), 400, "max_tokens", "100000"),
    (body(max_completion_tokens=100_000), 400, "max_completion_tokens", "2048"),
    (body(bogus_field=1), 400, "bogus_field", "Unrecognized request argument"),
    (body(reasoning_effort="high"), 400, None, "reasoning_effort"),
    (body(functions=[{"name": "f"}]), 400, None, "use `tools`"),
    (body(response_format={"type": "xml"}), 400, "response_format", "json_schema"),
    (
        body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        "response_format",
        "schema",
    ),
    (
        body(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "bogus"}},
            }
        ),
        400,
        "response_format",
        "",
    ),
    (
        body(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
        400,
        "tools[0].function.name",
        "1-64 characters",
    ),
    (
        body(
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]
        ),
        400,
        "tools[0].function.parameters",
        "object",
    ),
    (body(tools=[{"type": "retrieval"}]), 400, "tools[0].type", "function"),
    (body(tool_choice="required"), 400, None, "tool_choice needs `tools`"),
    (
        body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
        400,
        None,
        "not in `tools`",
    ),
    (
        body(
            tools=[WEATHER],
            tool_choice="required",
            response_format={"type": "json_object"},
        ),
        400,
        "response_format",
        "cannot be combined",
    ),
    (body(model="no-such-model"), 404, "model", "Served models: tiny"),
]


@pytest.mark.parametrize(("payload", "status", "param", "words"), BAD_REQUESTS)
def test_bad_request_gets_a_clear_error(server, payload, status, param, words):
    response = httpx.post(f"{server.url}/v1/chat/completions", json=payload)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize(
    "raw", [b"not json", b"[1, 2]", b'{"model": "tiny", "messages": [', b"\xff\xfe"]
)
def test_malformed_body_is_a_400(server, raw):
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "rollout_id", ["..%2F..%2Fetc", "a" * 200, "bad%20id", "-starts-with-dash"]
)
def test_bad_rollout_ids_are_rejected(server, rollout_id):
    response = httpx.post(f"{server.url}/rollouts/{rollout_id}/v1/chat/completions", json=body())
    assert response.status_code in (400, 404)
    assert "error" in response.json()


def test_bad_rollout_header_is_rejected(server):
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json=body(), headers={"X-Rollout-Id": "a/b"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "rollout_id"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"name": "../evil@1", "path": "x"}, "Invalid adapter name"),
        ({"name": "agent", "path": "x"}, "Invalid adapter name"),
        ({"name": "agent@1", "path": "/etc"}, "outside the server's --path"),
    ],
)
def test_adapter_names_and_paths_are_validated(server, payload, words):
    response = httpx.post(f"{server.url}/v1/adapters", json=payload)
    assert response.status_code == 400
    assert words in response.json()["error"]["message"]


def test_unknown_completion_id_is_a_404(server):
    response = httpx.get(f"{server.url}/v1/chat/completions/chatcmpl-missing")
    assert response.status_code == 404
    assert "evicted" in response.json()["error"]["message"]


def test_server_still_serves_after_bad_input(server):
    for payload, *_ in BAD_REQUESTS[:5]:
        httpx.post(f"{server.url}/v1/chat/completions", json=payload)
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body())
    assert response.status_code == 200
    assert json.loads(response.text)["choices"][0]["finish_reason"] in ("stop", "length")


def test_sdk_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError, match="Served models"):
        client.chat.completions.create(model="nope", messages=USER)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=USER, temperature=9)


class TestAuthentication:
    def test_missing_key_is_a_401(self, keyed_server):
        response = httpx.post(f"{keyed_server.url}/v1/chat/completions", json=body())
        assert response.status_code == 401
        assert "Authorization: Bearer" in response.json()["error"]["message"]

    def test_wrong_key_is_a_401_through_the_sdk(self, keyed_server):
        wrong = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="tiny", messages=USER, max_tokens=2)

    @pytest.mark.parametrize(
        "path", ["/v1/models", "/metrics", "/v1/rollouts/r1", "/rollouts/r1/v1/models"]
    )
    def test_every_route_but_health_needs_the_key(self, keyed_server, path):
        assert httpx.get(f"{keyed_server.url}{path}").status_code == 401
        assert httpx.get(f"{keyed_server.url}{path}", headers=keyed_server.headers()).is_success

    def test_health_is_open(self, keyed_server):
        assert httpx.get(f"{keyed_server.url}/health").json() == {"status": "ok"}

    def test_right_key_works_through_the_sdk(self, keyed_server):
        right = openai.OpenAI(
            base_url=f"{keyed_server.url}/v1", api_key="secret-key", max_retries=0
        )
        reply = right.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
        assert reply.usage.completion_tokens == 2

    def test_no_key_configured_means_open(self, server):
        assert httpx.get(f"{server.url}/v1/models").is_success
