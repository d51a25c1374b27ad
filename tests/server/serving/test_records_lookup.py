"""Reading many completion records in one request, and each record's timing."""

from __future__ import annotations

import time

import httpx

from tests.support.servers import RunningServer

MESSAGES = [{"role": "user", "content": "Say something."}]


def test_lookup_returns_the_stored_records_in_the_order_asked_and_names_the_missing(
    client, server: RunningServer
):
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    second = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)

    answer = httpx.post(
        f"{server.url}/v1/chat/completions/lookup",
        json={"ids": [second.id, "chatcmpl-never-served", first.id]},
    ).json()

    assert [record["id"] for record in answer["data"]] == [second.id, first.id]
    assert answer["missing"] == ["chatcmpl-never-served"]
    single = httpx.get(f"{server.url}/v1/chat/completions/{first.id}").json()
    assert answer["data"][1] == single


def test_lookup_without_tokens_leaves_out_token_ids_and_logprobs(client, server: RunningServer):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)

    [record] = httpx.post(
        f"{server.url}/v1/chat/completions/lookup", json={"ids": [response.id], "tokens": False}
    ).json()["data"]

    assert "prompt_token_ids" not in record
    assert set(record["choices"][0]) == {"index", "message", "finish_reason"}
    assert record["usage"] == response.usage.model_dump(exclude_none=True)
    assert record["request"]["max_tokens"] == 3


def test_a_record_keeps_when_its_request_arrived_and_when_it_was_done(
    client, server: RunningServer
):
    before = time.time()
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    after = time.time()

    record = httpx.get(f"{server.url}/v1/chat/completions/{response.id}").json()

    assert before <= record["started_at"] <= record["recorded_at"] <= after


def test_lookup_rejects_a_body_that_is_not_a_list_of_ids(server: RunningServer):
    url = f"{server.url}/v1/chat/completions/lookup"
    assert httpx.post(url, json={"ids": "chatcmpl-1"}).status_code == 400
    assert httpx.post(url, json={"ids": ["x"] * 10_001}).status_code == 400
    unknown = httpx.post(url, json={"ids": [], "fields": ["usage"]})
    assert unknown.status_code == 400 and "fields" in unknown.json()["error"]["message"]
