"""The vLLM engine, for real: our server in front of a vLLM server on this CPU (make test-vllm).

The contract tests (test_server_openai.py, test_server_errors.py, ...) run on it too with
`--engine vllm`; these are what only the vLLM engine has: the engine it says it runs, the ids it
records against the HF tokenizer, adapters hot-loaded after a training step, an adapter
unloaded while a request uses it, and `art-server --engine vllm` managing its own child.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

import art_core as art
from tests.support.models import fresh_model
from tests.support.processes import stop_process
from tests.support.rollouts import groups_for, varied_group
from tests.support.servers import RunningServer, free_port, running_server

pytestmark = pytest.mark.vllm


def test_the_server_says_it_runs_vllm(server: RunningServer):
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "engine": "vllm"}
    text = httpx.get(f"{server.url}/metrics").text
    assert 'art_engine_info{engine="vllm"} 1' in text


@pytest.mark.parametrize("stream", [False, True])
def test_recorded_ids_are_the_hf_tokenizers(client, server: RunningServer, tiny_model_dir, stream):
    """Prompt ids are ours (rendered and tokenized here); completion ids decode to the text."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    response = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=1.0, seed=5, stream=stream
    )
    if stream:
        chunks = list(response)
        completion_id = chunks[0].id
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        completion_id, text = response.id, response.choices[0].message.content
    record = httpx.get(f"{server.url}/v1/chat/completions/{completion_id}").json()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert record["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)
    choice = record["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]) > 0
    assert all(value <= 0.0 for value in choice["logprobs"])
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == text


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
PARITY_REQUESTS = {
    "plain": {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 40},
    "json_object": {
        "messages": [{"role": "user", "content": "Give JSON"}],
        "max_tokens": 60,
        "response_format": {"type": "json_object"},
    },
    "required_tool": {
        "messages": [{"role": "user", "content": "Add 2 and 3"}],
        "max_tokens": 60,
        "tools": TOOLS,
        "tool_choice": "required",
    },
}


@pytest.fixture(scope="module")
def torch_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same weights on the torch engine, to compare answers with."""
    with running_server(tiny_model_dir, tmp_path_factory.mktemp("art-torch")) as running:
        yield running


@pytest.mark.parametrize("kind", PARITY_REQUESTS)
def test_greedy_answers_are_the_torch_engines_token_for_token(
    server: RunningServer, torch_server: RunningServer, kind: str
):
    """A user cannot tell which engine answered: greedy ids, text and finish reason match, with
    and without a grammar (vLLM runs our llguidance grammar)."""
    answers = []
    for running in (torch_server, server):
        body = {"model": "tiny", "temperature": 0.0, **PARITY_REQUESTS[kind]}
        answer = httpx.post(f"{running.url}/v1/chat/completions", json=body, timeout=120).json()
        record = httpx.get(f"{running.url}/v1/chat/completions/{answer['id']}").json()
        choice = answer["choices"][0]
        answers.append(
            (record["choices"][0]["token_ids"], choice["message"], choice["finish_reason"])
        )
    assert answers[0] == answers[1]


def _chat(running: RunningServer, body: dict) -> tuple[list[int], str, str]:
    """The recorded ids, the content (streamed or not) and the finish reason of one answer."""
    url = f"{running.url}/v1/chat/completions"
    if not body.get("stream"):
        answer = httpx.post(url, json=body, timeout=120).json()
        assert "id" in answer, answer
        completion_id = answer["id"]
        content = answer["choices"][0]["message"]["content"]
        reason = answer["choices"][0]["finish_reason"]
    else:
        content, reason = "", None
        with httpx.stream("POST", url, json=body, timeout=120) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                completion_id = chunk["id"]
                for choice in chunk["choices"]:
                    content += choice["delta"].get("content") or ""
                    reason = choice.get("finish_reason") or reason
    record = httpx.get(f"{running.url}/v1/chat/completions/{completion_id}").json()
    return record["choices"][0]["token_ids"], content, str(reason)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("matcher", ["vllm", "ours"])
def test_stop_strings_end_a_choice_as_the_torch_engine_ends_it(
    server: RunningServer, torch_server: RunningServer, matcher: str, stream: bool
):
    """A stop from the middle of a greedy answer: few and short stops go to vLLM, long ones
    through our automaton (`_vllm_choice`); either way the ids, text and finish reason are the
    torch engine's, and a stream never shows the stop."""
    # Under a JSON grammar: the tiny model's free greedy answer is newlines only.
    body = {"model": "tiny", "temperature": 0.0, **PARITY_REQUESTS["json_object"]}
    _, full, _ = _chat(torch_server, body)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(full) > 10 and stop.strip()
    # Chat takes at most 4 stops (OpenAI's limit), of up to 16,384 characters in all: long
    # ones are ours (Messages takes 256).
    decoys = [] if matcher == "vllm" else [f"never seen {n} " * 20 for n in range(3)]
    body |= {"stop": [*decoys, stop], "stream": stream}
    answers = [_chat(running, body) for running in (torch_server, server)]
    assert answers[0] == answers[1]
    _, content, reason = answers[1]
    assert reason == "stop" and stop not in content and full.startswith(content)


def test_seed_repeats_and_n_differs(client):
    def ask(**extra):
        response = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=10,
            temperature=1.0,
            **extra,
        )
        return [choice.message.content for choice in response.choices]

    assert ask(seed=7) == ask(seed=7)
    assert len(set(ask(n=4))) > 1


async def test_a_training_step_is_hot_loaded_and_agrees_with_the_sampler(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, training_server: RunningServer
):
    """After a step vLLM serves name@1 (without a restart) and its policy differs from name@0's
    (the greedy tokens' logprobs: the tiny random model's greedy text can stay the same, e.g. all
    newlines); the trainer's logprobs of vLLM's sampled tokens agree with vLLM's (ratio ~ 1)."""
    model = await fresh_model(remote_backend, tiny_model_dir)
    client = model.openai_client()
    question = [{"role": "user", "content": "Say something."}]

    async def greedy(name: str) -> tuple[str, list[float]]:
        response = await client.chat.completions.create(
            model=name,
            messages=question,
            max_tokens=16,
            temperature=0.0,  # type: ignore[arg-type]
            logprobs=True,
        )
        choice = response.choices[0]
        assert choice.logprobs is not None and choice.logprobs.content is not None
        return choice.message.content or "", [t.logprob for t in choice.logprobs.content]

    before = await greedy(model.get_inference_name(0))
    groups = varied_group(await groups_for(model, ["one", "two", "three"], per_group=4))
    await model.train(groups, config=art.TrainConfig(learning_rate=5e-2))
    assert await model.get_step() == 1
    engine = training_server.service.engine
    assert model.get_inference_name(1) in engine.adapters
    after = await greedy(model.get_inference_name(1))
    text_changed = after[0] != before[0]
    assert (
        text_changed or max(abs(a - b) for a, b in zip(after[1], before[1], strict=False)) > 1e-3
    ), after
    history = training_server.art_path / model.project / "models" / model.name / "history.jsonl"
    rows = [json.loads(line) for line in history.read_text().splitlines()]
    trained = next(row["metrics"] for row in rows if row["type"] == "train")
    assert abs(trained["ratio_mean"] - 1.0) < 0.01, trained
    assert trained["logprob_abs_diff"] < 0.01, trained


async def test_an_adapter_unloaded_mid_request_finishes_that_request(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, training_server: RunningServer
):
    model = await fresh_model(remote_backend, tiny_model_dir)
    engine = training_server.service.engine
    name = model.get_inference_name(0)
    stream = await model.openai_client().chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=200,
        stream=True,
    )
    chunks = [await anext(stream)]
    await asyncio.to_thread(engine.unload_adapter, name)
    assert name not in engine.adapters  # new requests are refused at once
    chunks += [chunk async for chunk in stream]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    deadline = time.monotonic() + 10  # then vLLM lets it go
    while time.monotonic() < deadline:
        served = httpx.get(f"{engine.process.base_url}/v1/models").json()["data"]
        if not any(entry["id"].endswith(name) for entry in served):
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail(f"vLLM still serves {name} after its last request ended")


async def test_a_rank_above_the_engines_limit_is_a_400(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    model = art.TrainableModel(
        name="too-wide",
        project="vllm-tests",
        base_model=str(tiny_model_dir),
        lora=art.LoRAConfig(r=64),
    )
    with pytest.raises(art.BackendRequestError) as raised:
        await model.register(remote_backend)
    assert "--max-lora-rank" in str(raised.value)


def test_art_server_runs_and_ends_its_own_vllm(tiny_model_dir: Path, tmp_path: Path):
    """`art-server --engine vllm` starts vLLM as a child and takes it down when it stops."""
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "art_backend.cli"),
            *("--model", str(tiny_model_dir), "--name", "tiny", "--dtype", "float32"),
            *("--engine", "vllm", "--vllm-kv-cache-gb", "1", "--port", str(port)),
            *("--path", str(tmp_path / "art")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "art" / "logs" / "vllm.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        children = _vllm_children(process.pid)
        assert children, "no vLLM process under art-server"
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        # vLLM dies under the server: every answer names its exit and its log, /health too.
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        # psutil calls a killed process a zombie once its main thread has exited; waitpid (what
        # the server asks) reports it only after its last thread has, and vLLM has many: in CI,
        # on a loaded machine, the first /health after the kill twice still said ok. It must
        # turn within seconds.
        deadline = time.monotonic() + 30
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
        while health.status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
        assert health.status_code == 503, (health.text, _described(children))
        assert health.json()["status"] == "engine_stopped"
        assert "vLLM exited with code" in health.json()["error"]
        refused = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]},
            timeout=60,
        )
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "vLLM exited with code" in message and "vllm.log" in message
    finally:
        process.send_signal(signal.SIGTERM)
        stop_process(process)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in children), "vLLM outlived art-server"


def _vllm_children(pid: int) -> list[int]:
    import psutil

    return [
        child.pid
        for child in psutil.Process(pid).children(recursive=True)
        if "vllm" in " ".join(child.cmdline())
    ]


def _described(pids: list[int]) -> list[str]:
    """Each pid's status and command line, for a failure message."""
    import psutil

    described = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            described.append(f"{pid} {process.status()} {' '.join(process.cmdline())[:120]}")
        except psutil.Error as error:
            described.append(f"{pid} {type(error).__name__}")
    return described


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
