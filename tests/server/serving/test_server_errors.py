"""Bad input gets an OpenAI-shaped 4xx that names the field; the server keeps serving."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

USER = [{"role": "user", "content": "hi"}]
# A schema that is only a reference to itself compiles, then has no first token.
SELF = {"$ref": "#"}
# An object that requires itself compiles, then passes the lexer's limits at its first token.
REQUIRES_ITSELF = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
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
    (body(min_p=1.5), 400, "min_p", "less than or equal to 1"),
    (body(repetition_penalty=0), 400, "repetition_penalty", "greater than 0"),
    (body(top_p=0), 400, "top_p", "greater than 0"),
    (body(top_p=1.5), 400, "top_p", "less than or equal to 1"),
    (body(max_tokens=0), 400, "max_tokens", "greater than or equal to 1"),
    (body(n=0), 400, "n", "greater than or equal to 1"),
    (body(n=65), 400, "n", "less than or equal to 64"),
    (body(top_logprobs=21, logprobs=True), 400, "top_logprobs", "less than or equal to 20"),
    (body(top_logprobs=2), 400, "top_logprobs", "logprobs"),
    (body(presence_penalty=3), 400, "presence_penalty", "less than or equal to 2"),
    (body(frequency_penalty=-3), 400, "frequency_penalty", "greater than or equal to -2"),
    (body(logit_bias={"5": 200}), 400, "logit_bias", "[-100, 100]"),
    (body(logit_bias={"abc": 1}), 400, "logit_bias", "token ids"),
    (body(logit_bias={"99999": 1}), 400, "logit_bias", "outside the vocabulary"),
    (body(stop=["a", "b", "c", "d", "e"]), 400, "stop", "at most 4"),
    (body(stop=["x" * 10_000] * 4), 400, "stop", "16,384 characters in all"),
    (body(stop="x" * 16_385), 400, "stop", "16,384 characters in all"),
    (body(max_tokens=100_000), 400, "max_tokens", "100000"),
    (body(max_completion_tokens=100_000), 400, "max_completion_tokens", "2048"),
    (body(bogus_field=1), 400, "bogus_field", "Unrecognized request argument"),
    (body(reasoning_effort="high"), 400, "reasoning_effort", "reasoning_effort"),
    (body(functions=[{"name": "f"}]), 400, "functions", "use `tools`"),
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
    (body(tool_choice="required"), 400, "tool_choice", "tool_choice needs `tools`"),
    (
        body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
        400,
        "tool_choice",
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
    # Each of these was a 500 once.
    (body(seed=2**64), 400, "seed", "less than or equal to 9223372036854775807"),
    (body(seed=2**70), 400, "seed", "less than or equal to"),
    (body(seed=-(2**63) - 1), 400, "seed", "greater than or equal to -9223372036854775808"),
    (
        body(response_format={"type": "json_schema", "json_schema": "a string"}),
        400,
        "response_format",
        "json_schema must be an object",
    ),
    (
        body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SELF}}),
        400,
        "response_format",
        "fails at its first token",
    ),
    (
        body(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": REQUIRES_ITSELF},
            }
        ),
        400,
        "response_format",
        "fails at its first token",
    ),
    (
        body(
            tools=[{"type": "function", "function": {"name": "f", "parameters": SELF}}],
            tool_choice="required",
        ),
        400,
        "tools",
        "tool 'f'",
    ),
    *[
        (body(**{name: "x"}), 400, name, "unsupported parameter")
        for name in ("audio", "prediction", "web_search_options", "verbosity", "function_call")
    ],
    (body(logit_bias={"--5": 1}), 400, "logit_bias", "token ids"),
    (body(logit_bias={"²": 1}), 400, "logit_bias", "token ids"),  # str.isdigit() says yes
    (body(logit_bias={"1" * 40: 1}), 400, "logit_bias", "token ids"),
    (body(metadata={f"k{i}": "v" for i in range(17)}), 400, "metadata", "at most 16"),
    (body(metadata={"k": "v" * 513}), 400, "metadata", "at most 512"),
    (body(metadata={"k": {"nested": 1}}), 400, "metadata.k", "string"),
    # Strict booleans: "yes", "false" and 1 are no answers to a yes-or-no field.
    (body(stream="yes"), 400, "stream", "valid boolean"),
    (body(stream="false"), 400, "stream", "valid boolean"),
    (body(logprobs=1), 400, "logprobs", "valid boolean"),
    # Strict integers: "2" and 2.5 are no counts (once: "2" asked for two choices).
    (body(n="2"), 400, "n", "valid integer"),
    (body(max_tokens=2.5), 400, "max_tokens", "valid integer"),
    (body(seed=True), 400, "seed", "valid integer"),
    (
        body(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        400,
        "messages[0].content",
        "text part",
    ),
    (body(stop=["a", 5]), 400, "stop[1]", "valid string"),  # once `stop`: "a valid string"
]

CALL = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}


def with_arguments(arguments: str) -> dict:
    """A chat whose assistant turn called a tool with these `arguments` (a JSON string)."""
    call = {**CALL, "function": {**CALL["function"], "arguments": arguments}}
    return body(
        tools=[WEATHER],
        messages=[
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
    )


def test_tool_call_arguments_nested_too_deep_to_render_are_kept_as_text(server):
    """Parsed, 200 levels would pass the template's limits: kept as the text they came as (the
    unit tests in test_tool_calls.py cover arguments that do not parse at all)."""
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=with_arguments("[" * 200 + "]" * 200),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert_still_serving(server)


LONE = "\\ud800"  # as JSON writes it: valid JSON, not text
RESPONSES_BODY = '{"model": "tiny", "input": "a' + LONE + 'b", "max_output_tokens": 4}'
# (path, raw JSON body, status, param, words): bodies `json=` cannot send.
RAW_BAD_BODIES = [
    ("/v1/chat/completions", json.dumps(body()).replace('"hi"', f'"h{LONE}i"'), 400,
     "messages[0].content", "lone UTF-16 surrogate"),
    ("/v1/chat/completions", json.dumps(body(metadata={"k": "v"})).replace('"v"', f'"{LONE}"'),
     400, "metadata.k", "lone UTF-16 surrogate"),
    ("/v1/chat/completions", json.dumps(body()).replace('"hi"', '"\\udc00\\ud800"'), 400,
     "messages[0].content", "lone UTF-16 surrogate"),  # two halves in the wrong order
    ("/v1/responses", RESPONSES_BODY, 400, "input", "lone UTF-16 surrogate"),
    ("/v1/training/models/p/m/log", '{"trajectories": [{"id": "t' + LONE + '"}]}', 400,
     "trajectories[0].id", "lone UTF-16 surrogate"),
    ("/v1/chat/completions", json.dumps(body()).replace('"max_tokens": 4', '"max_tokens": '
     + "9" * 4301), 400, "max_tokens", "`max_tokens` holds a number"),
    ("/v1/training/models", '{"project": "p", "name": "m", "seed": ' + "9" * 4301 + "}", 400,
     "seed", "4300 digits"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [' + "1," * 100_000 + "1]}",
     400, "body", "more than 100,000 JSON values"),
    ("/v1/training/models", '{"project": "p", "x": [' + "1," * 100_000 + "1]}", 400,
     "body", "more than 100,000 JSON values"),
    # Every protocol reads its body through one door (`parse_json_object`): each names the
    # field of a 5,000-digit integer (its JSON path, however deep) and `body` for a body of
    # 100,000 levels (more values than a request may hold) or one nested too deep from the top.
    ("/v1/completions", '{"model": "tiny", "prompt": "hi", "max_tokens": ' + "9" * 5000 + "}",
     400, "max_tokens", "4300 digits"),
    ("/v1/responses", '{"model": "tiny", "input": [{"role": "user", "content": "hi"}], '
     '"metadata": {"n": [1, ' + "9" * 5000 + "]}}", 400, "metadata.n[1]", "4300 digits"),
    ("/v1/messages", '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
     '"max_tokens": ' + "9" * 5000 + "}", 400, "max_tokens", "`max_tokens` holds a number"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": ' + "[" * 100_000 + "]" * 100_000
     + "}", 400, "body", "more than 100,000 JSON values"),
    ("/v1/messages", '{"model": "tiny", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}",
     400, "body", "more than 100,000 JSON values"),
    ("/v1/completions", "[" * 5_000 + "]" * 5_000, 400, "body", "The request body nests JSON"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "raw", "status", "param", "words"),
    RAW_BAD_BODIES,
    ids=[
        "chat-surrogate", "metadata-surrogate", "reversed-pair", "responses-surrogate",
        "log-surrogate", "chat-4301-digits", "register-4301-digits", "chat-too-many-values",
        "register-too-many-values", "completions-5000-digits", "responses-nested-5000-digits",
        "messages-5000-digits", "chat-100000-deep", "messages-100000-deep",
        "completions-deep-from-the-top",
    ],
)  # fmt: skip
def test_raw_bodies_that_json_cannot_send_get_a_clear_error(
    server, path, raw, status, param, words
):
    response = httpx.post(
        f"{server.url}{path}", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["param"] == param
    assert_still_serving(server)


# Values in OpenAI's ranges that once broke the sampler (a NaN from dividing by a denormal
# temperature, every token removed by a top_p below float32's smallest number): now served.
EDGE_VALUES = [
    {"top_p": 5e-324},
    {"temperature": 1e-320},
    {"temperature": 5e-324, "top_p": 5e-324, "top_k": 1},
    {"seed": -1},
    {"min_p": 1.0, "repetition_penalty": 2.0},  # only the best token; seen ones pushed down
    {"seed": -(2**63)},
    {"seed": 2**63 - 1, "n": 2},
]


def assert_still_serving(server) -> None:
    """A real completion succeeds: the bad request before it left the server healthy."""
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body(), timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(("payload", "status", "param", "words"), BAD_REQUESTS)
def test_bad_request_gets_a_clear_error_naming_the_field(server, payload, status, param, words):
    response = httpx.post(f"{server.url}/v1/chat/completions", json=payload, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"]
    assert error["param"] == param
    assert_still_serving(server)


@pytest.mark.parametrize("fields", EDGE_VALUES, ids=[str(fields) for fields in EDGE_VALUES])
def test_edge_values_in_range_are_served(server, fields):
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body(**fields), timeout=60)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == fields.get("n", 1)
    assert all(len(choice["token_ids"]) >= 1 for choice in choices)
    assert_still_serving(server)


def test_a_temperature_near_zero_draws_the_greedy_tokens(server):
    near_zero = httpx.post(
        f"{server.url}/v1/chat/completions", json=body(temperature=1e-320), timeout=60
    )
    greedy = httpx.post(f"{server.url}/v1/chat/completions", json=body(temperature=0), timeout=60)
    assert near_zero.json()["choices"][0]["token_ids"] == greedy.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/v1/chat/completions", {"POST"}),
        ("GET", "/v1/adapters", {"POST"}),
        ("POST", "/v1/models", {"GET"}),
        ("PATCH", "/v1/rollouts/r1", {"GET", "DELETE"}),
        ("DELETE", "/health", {"GET"}),
    ],
)
def test_a_method_the_path_does_not_take_is_a_405_naming_the_allowed_ones(
    server, method, path, allowed
):
    response = httpx.request(method, f"{server.url}{path}")
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["allow"].split(",")} == allowed
    assert response.json()["error"]["type"] == "invalid_request_error"


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
    ("payload", "param", "words"),
    [
        ({"name": "../evil@1", "path": "x"}, "name", "Invalid adapter name"),
        ({"name": "agent", "path": "x"}, "name", "Invalid adapter name"),
        ({"name": "agent@1", "path": "/etc"}, "path", "outside the server's --path"),
        ({"name": "agent@1", "path": "x\x00y"}, "path", "null byte"),
        ({"name": "agent@1", "path": "x" * 5000}, "path", ""),
    ],
)
def test_adapter_names_and_paths_are_validated(server, payload, param, words):
    response = httpx.post(f"{server.url}/v1/adapters", json=payload)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]
    assert response.json()["error"]["param"] == param
    assert_still_serving(server)


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

    def test_health_is_open(self, keyed_server, test_engine):
        health = httpx.get(f"{keyed_server.url}/health").json()
        assert health == {"status": "ok", "engine": test_engine}

    def test_right_key_works_through_the_sdk(self, keyed_server):
        right = openai.OpenAI(
            base_url=f"{keyed_server.url}/v1", api_key="secret-key", max_retries=0
        )
        reply = right.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
        assert reply.usage.completion_tokens == 2

    def test_no_key_configured_means_open(self, server):
        assert httpx.get(f"{server.url}/v1/models").is_success
