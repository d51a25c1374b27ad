"""Capture scopes: `art.trajectory()` tags every call to our backend, whatever client made it.

Real parts throughout: the tiny model's server, the openai SDK, httpx, requests, aiohttp,
LangChain's ChatOpenAI, and a plain HTTP server on another port standing for any other host.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import requests
from langchain_openai import ChatOpenAI
from openai.types.chat.chat_completion import Choice

import art_core as art
from tests.support.models import fresh_model
from tests.support.servers import RunningServer

# ---------------------------------------------------------------------------------- helpers


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    """A fresh model on the in-process training server."""
    return await fresh_model(remote_backend, tiny_model_dir)


def chat_body(model: art.TrainableModel, prompt: str) -> dict[str, Any]:
    return {
        "model": model.get_inference_name(),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
    }


def chat_url(model: art.TrainableModel) -> str:
    return f"{model.inference_base_url}/chat/completions"


def async_openai(model: art.TrainableModel) -> openai.AsyncOpenAI:
    """A stock client on the backend (not model.openai_client(): nothing of ours in it)."""
    return openai.AsyncOpenAI(
        base_url=model.inference_base_url, api_key=model.inference_api_key or "unused"
    )


async def ask(client: openai.AsyncOpenAI, model: art.TrainableModel, prompt: str) -> Any:
    return await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": prompt}],
        max_tokens=4,
    )


def prompts(trajectory: art.Trajectory) -> list[str]:
    """The user prompts of every conversation in the trajectory, in order."""
    return [
        message["content"]
        for history in trajectory.histories()
        for message in history.messages()
        if message["role"] == "user"
    ]


def choices(trajectory: art.Trajectory) -> list[Choice]:
    return [
        item
        for history in trajectory.histories()
        for item in history.messages_and_choices
        if isinstance(item, Choice)
    ]


class OtherHost:
    """A plain HTTP server on another 127.0.0.1 port: it keeps the headers of every request."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        seen = self.headers

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen.append({k.lower(): v for k, v in self.headers.items()})
                body = json.dumps({"ok": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat/completions"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture
def other_host() -> Iterator[OtherHost]:
    host = OtherHost()
    yield host
    host.server.shutdown()
    host.server.server_close()


# ------------------------------------------------------------------- what a scope captures


async def test_async_openai_calls_become_the_trajectory_with_the_fields_set_inside(
    model: art.TrainableModel,
):
    client = async_openai(model)
    async with art.trajectory(model=model) as t:
        assert art.current_trajectory() is t
        messages: list[Any] = [{"role": "user", "content": "Count to three."}]
        first = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_tokens=4
        )
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Again."},
        ]
        second = await client.chat.completions.create(
            model=model.get_inference_name(), messages=messages, max_tokens=4
        )
        t.reward = 0.5
        t.metrics["turns"] = 2
        t.metadata["scenario"] = "count"
        t.log("two turns")
    assert art.current_trajectory() is None
    assert [m["role"] for m in t.messages()] == ["user", "assistant", "user", "assistant"]
    assert not t.additional_histories  # the second call extends the first
    # The assistant turns are the server's records of these very completions (exact tokens).
    assert [c.completion_id for c in choices(t)] == [first.id, second.id]  # type: ignore[attr-defined]
    assert t.reward == 0.5 and t.metrics["turns"] == 2 and t.logs == ["two turns"]
    assert t.metadata["scenario"] == "count" and t.metadata["rollout_id"].startswith("rollout-")
    assert t.metrics["duration"] >= 0


async def test_sync_openai_in_a_plain_with_block(model: art.TrainableModel):
    def run() -> art.Trajectory:
        client = openai.OpenAI(base_url=model.inference_base_url, api_key="unused")
        with art.trajectory(model=model) as t:
            client.chat.completions.create(
                model=model.get_inference_name(),
                messages=[{"role": "user", "content": "sync hello"}],
                max_tokens=4,
            )
            t.reward = 1.0
        return t

    t = await asyncio.to_thread(run)
    assert prompts(t) == ["sync hello"] and len(choices(t)) == 1 and t.reward == 1.0


@pytest.mark.parametrize("library", ["httpx", "httpx-async", "requests", "aiohttp"])
async def test_every_http_library_is_tagged(model: art.TrainableModel, library: str):
    prompt = f"plain {library}"
    body, url = chat_body(model, prompt), chat_url(model)
    async with art.trajectory(model=model) as t:
        if library == "httpx":
            httpx.post(url, json=body, timeout=60).raise_for_status()
        elif library == "httpx-async":
            async with httpx.AsyncClient(timeout=60) as client:
                (await client.post(url, json=body)).raise_for_status()
        elif library == "requests":
            # In a worker thread: asyncio.to_thread copies the scope into it.
            response = await asyncio.to_thread(requests.post, url, json=body, timeout=60)
            response.raise_for_status()
        else:
            async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
                r.raise_for_status()
                await r.json()
    assert prompts(t) == [prompt] and len(choices(t)) == 1


async def test_langchain_chat_openai_is_captured(model: art.TrainableModel):
    llm = ChatOpenAI(
        model=model.get_inference_name(),
        base_url=model.inference_base_url,
        api_key="unused",  # type: ignore[arg-type]
        max_tokens=4,  # type: ignore[call-arg]
    )
    async with art.trajectory(model=model) as t:
        answer = await llm.ainvoke("langchain hello")
    assert prompts(t) == ["langchain hello"]
    assert choices(t)[0].message.content == answer.content


async def test_calls_to_another_host_are_left_untouched(
    model: art.TrainableModel, other_host: OtherHost
):
    body = chat_body(model, "to our backend")
    async with art.trajectory(model=model) as t:
        headers = {"x-custom": "kept"}
        httpx.post(other_host.url, json={"a": 1}, headers=headers, timeout=10)
        await asyncio.to_thread(
            requests.post, other_host.url, json={"a": 1}, headers=headers, timeout=10
        )
        async with aiohttp.ClientSession() as session:
            async with session.post(other_host.url, json={"a": 1}, headers=headers) as r:
                await r.read()
            async with session.post(chat_url(model), json=body) as r:
                r.raise_for_status()
    assert len(other_host.headers) == 3
    assert all("x-rollout-id" not in seen for seen in other_host.headers)
    assert all(seen["x-custom"] == "kept" for seen in other_host.headers)
    assert prompts(t) == ["to our backend"]


async def test_a_rollout_id_the_caller_sets_wins(
    model: art.TrainableModel, remote_backend: art.RemoteBackend
):
    own_id = f"rollout-{uuid.uuid4().hex[:16]}"
    async with art.trajectory(model=model) as t, httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            chat_url(model), json=chat_body(model, "mine"), headers={"X-Rollout-Id": own_id}
        )
        response.raise_for_status()
    assert prompts(t) == []
    assert len(await remote_backend.rollout_records(own_id)) == 1


async def test_a_scope_without_model_captures_calls_to_registered_models_backends(
    keyed_server: RunningServer, tiny_model_dir: Path
):
    # A backend no earlier scope named: only its model's registration makes it known.
    backend = art.RemoteBackend(keyed_server.url, api_key=keyed_server.api_key)
    model = await fresh_model(backend, tiny_model_dir)
    client = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key=keyed_server.api_key)
    async with art.trajectory() as t:
        await ask(client, model, "no model named")
    assert prompts(t) == ["no model named"]
    await backend.close()


def test_a_scope_without_model_before_any_registration_says_what_to_do():
    code = (
        "import art_core as art\n"
        "try:\n"
        "    art.trajectory()\n"
        "except art.ModelNotRegisteredError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "model.register(backend)" in result.stdout and "model=" in result.stdout


# ------------------------------------------------------------------ nesting and concurrency


async def test_no_capture_hides_the_scope_and_a_scope_inside_captures_again(
    model: art.TrainableModel,
):
    client = async_openai(model)
    async with art.trajectory(model=model) as outer:
        await ask(client, model, "outer")
        with art.no_capture():
            assert art.current_trajectory() is None
            await ask(client, model, "hidden")
            async with art.trajectory(model=model) as inner:
                await ask(client, model, "inner")
        assert art.current_trajectory() is outer
    assert prompts(outer) == ["outer"]
    assert prompts(inner) == ["inner"]


async def test_nested_scopes_each_keep_their_own_calls(model: art.TrainableModel):
    client = async_openai(model)
    async with art.trajectory(model=model) as outer:
        async with art.trajectory(model=model) as inner:
            assert art.current_trajectory() is inner
            await ask(client, model, "inner")
        assert art.current_trajectory(require=True) is outer
        await ask(client, model, "outer")
    assert prompts(outer) == ["outer"] and prompts(inner) == ["inner"]


async def test_concurrent_scopes_do_not_mix(model: art.TrainableModel):
    client = async_openai(model)

    async def run(name: str) -> art.Trajectory:
        async with art.trajectory(model=model) as t:
            for turn in range(2):
                await ask(client, model, f"{name} {turn}")
                await asyncio.sleep(0)  # let the other run interleave
        return t

    first, second = await asyncio.gather(run("first"), run("second"))
    assert sorted(prompts(first)) == ["first 0", "first 1"]
    assert sorted(prompts(second)) == ["second 0", "second 1"]


async def test_current_trajectory_outside_a_scope():
    assert art.current_trajectory() is None
    with pytest.raises(art.NoTrajectoryError, match=r"art\.trajectory"):
        art.current_trajectory(require=True)
    with pytest.raises(art.UnknownFieldError, match="did you mean 'require'"):
        art.current_trajectory(required=True)  # type: ignore[call-overload]


# ------------------------------------------------------------------------- groups, training


async def test_a_group_scope_collects_its_rollouts_and_the_group_trains(
    model: art.TrainableModel,
):
    client = async_openai(model)
    sampled_tokens = 0

    async def rollout(reward: float) -> None:
        nonlocal sampled_tokens
        async with art.trajectory(model=model):
            response = await ask(client, model, "Say something.")
            sampled_tokens += response.usage.completion_tokens
            art.current_trajectory(require=True).reward = reward

    async with art.trajectory_group(metadata={"scenario": "s"}) as group:
        await asyncio.gather(*(rollout(reward) for reward in (0.0, 1.0, 2.0)))
    assert sorted(group.rewards) == [0.0, 1.0, 2.0] and group.metadata == {"scenario": "s"}
    result = await model.train([group], config=art.TrainConfig(learning_rate=1e-4))
    assert result.step == 1
    assert result.metrics["trained_tokens"] == sampled_tokens  # every sampled token, once


async def test_awaited_forms_return_a_trajectory_and_a_group(model: art.TrainableModel):
    client = async_openai(model)

    async def rollout(prompt: str) -> None:
        await ask(client, model, prompt)
        art.current_trajectory(require=True).reward = len(prompt)

    async def broken() -> None:
        await ask(client, model, "before the failure")
        raise RuntimeError("tool failed")

    single = await art.trajectory(rollout("alone"), model=model)
    assert prompts(single) == ["alone"] and single.reward == 5
    async with art.trajectory(model=model) as outer:
        group = await art.trajectory_group(
            [art.trajectory(rollout(p), model=model) for p in ("a", "bb")]
            + [art.trajectory(broken(), model=model)],
            return_exceptions=True,
        )
    assert prompts(outer) == []  # the group's rollouts are isolated from the enclosing scope
    assert sorted(prompts(t)[0] for t in group) == ["a", "bb"]
    (failure,) = group.exceptions
    assert failure.type == "RuntimeError" and failure.partial_trajectory is not None
    assert prompts(failure.partial_trajectory) == ["before the failure"]
    with pytest.raises(RuntimeError, match="tool failed"):
        await art.trajectory_group([art.trajectory(broken(), model=model)])


# ------------------------------------------------------------------------------ failures


async def test_an_exception_keeps_the_calls_on_it_and_releases_the_records(
    model: art.TrainableModel, remote_backend: art.RemoteBackend
):
    client = async_openai(model)
    async with art.trajectory_group() as group:
        with pytest.raises(ValueError, match="agent broke") as info:
            async with art.trajectory(model=model):
                await ask(client, model, "first step")
                raise ValueError("agent broke")
    partial = info.value.art_trajectory  # type: ignore[attr-defined]
    assert prompts(partial) == ["first step"]
    assert any("not trained" in note for note in info.value.__notes__)
    # Not trained: released on the server at once, and kept in the group as an exception.
    assert await remote_backend.rollout_records(partial.metadata["rollout_id"]) == []
    assert len(group) == 0 and group.exceptions[0].type == "ValueError"


async def test_an_exception_in_a_plain_with_block(model: art.TrainableModel):
    def run() -> None:
        with art.trajectory(model=model):
            requests.post(chat_url(model), json=chat_body(model, "sync step"), timeout=60)
            raise KeyError("sync failure")

    with pytest.raises(KeyError) as info:
        await asyncio.to_thread(run)
    assert prompts(info.value.art_trajectory) == ["sync step"]  # type: ignore[attr-defined]


async def test_wrong_arguments_are_named(model: art.TrainableModel):
    with pytest.raises(art.UnknownFieldError, match="did you mean 'model'"):
        art.trajectory(modle=model)
    with pytest.raises(art.UnknownFieldError, match="log on each trajectory"):
        art.trajectory_group(logs=["x"])
    task = asyncio.ensure_future(asyncio.sleep(0))
    with pytest.raises(TypeError, match="coroutine"):
        art.trajectory(task, model=model)  # type: ignore[call-overload]
    await task
    scope = art.trajectory(model=model)
    async with scope:
        pass
    with pytest.raises(RuntimeError, match="entered once"):
        async with scope:
            pass
