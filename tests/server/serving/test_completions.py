"""POST /v1/completions (OpenAI's legacy Completions API) through the real openai SDK: prompts as
text or token ids, n, logprobs, echo, stop, streaming, the exact-token record, the refusals, and
a base model's plain-text rollouts training a GRPO step on exactly the sampled tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.completion_choice import CompletionChoice
from transformers import AutoTokenizer

import art_core as art
from tests.support.servers import RunningServer, running_server
from tests.support.tiny_model import build_tiny_model

PROMPT = "Question: What is 12 + 7?\nAnswer:"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def record_of(server: RunningServer, completion_id: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/v1/chat/completions/{completion_id}")
    assert response.status_code == 200, response.text
    return response.json()


def refusal(server: RunningServer, body: dict[str, Any], status: int = 400) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", **body})
    assert response.status_code == status, response.text
    return response.json()["error"]


# ------------------------------------------------------------------------------------ answers


def test_a_text_prompt_is_completed_and_recorded_with_its_exact_tokens(
    client: openai.OpenAI, server: RunningServer, tokenizer: Any
):
    completion = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6)
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    [choice] = completion.choices
    assert choice.index == 0 and choice.finish_reason in ("stop", "length")
    extra = choice.model_extra or {}
    assert extra["completion_id"] == completion.id
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=True)
    assert (completion.model_extra or {})["prompt_token_ids"] == prompt_ids
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(prompt_ids)
    assert completion.usage.completion_tokens == len(extra["token_ids"]) <= 6

    record = record_of(server, completion.id)
    assert record["object"] == "text_completion" and record["prompt_token_ids"] == prompt_ids
    [recorded] = record["choices"]
    assert recorded["token_ids"] == extra["token_ids"] and recorded["text"] == choice.text
    assert len(recorded["logprobs"]) == len(recorded["token_ids"])
    assert record["request"]["prompt"] == PROMPT


def test_the_default_max_tokens_is_openais_16(client: openai.OpenAI):
    completion = client.completions.create(model="tiny", prompt="The quick brown fox")
    token_ids = (completion.choices[0].model_extra or {})["token_ids"]
    assert len(token_ids) <= 16
    if completion.choices[0].finish_reason == "length":
        assert len(token_ids) == 16


def test_token_id_prompts_and_n_number_choices_prompt_by_prompt(
    client: openai.OpenAI, server: RunningServer
):
    first, second = [5, 6, 7], [8, 9]
    completion = client.completions.create(model="tiny", prompt=[first, second], n=2, max_tokens=4)
    assert [choice.index for choice in completion.choices] == [0, 1, 2, 3]
    prompts = [(choice.model_extra or {})["prompt_token_ids"] for choice in completion.choices]
    assert prompts == [first, first, second, second]
    assert completion.usage is not None and completion.usage.prompt_tokens == 5  # once each
    record = record_of(server, completion.id)
    assert [c["prompt_token_ids"] for c in record["choices"]] == prompts
    assert [c["index"] for c in record["choices"]] == [0, 1, 2, 3]

    single = client.completions.create(model="tiny", prompt=first, max_tokens=3)
    assert (single.model_extra or {})["prompt_token_ids"] == first


def test_a_list_of_texts_gets_n_choices_each(client: openai.OpenAI, tokenizer: Any):
    texts = ["Hello!", "The capital of France is"]
    completion = client.completions.create(model="tiny", prompt=texts, n=3, max_tokens=3)
    assert len(completion.choices) == 6
    for choice in completion.choices:
        expected = tokenizer.encode(texts[choice.index // 3], add_special_tokens=True)
        assert (choice.model_extra or {})["prompt_token_ids"] == expected


def test_logprobs_take_openais_legacy_shape(client: openai.OpenAI, server: RunningServer):
    completion = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, logprobs=3, temperature=1.0, seed=7
    )
    choice = completion.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None
    assert logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert logprobs.text_offset is not None
    count = len((choice.model_extra or {})["token_ids"])
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == count
    assert len(logprobs.top_logprobs) == len(logprobs.text_offset) == count
    # The numbers are the sampler's, as recorded for training.
    recorded = record_of(server, completion.id)["choices"][0]["logprobs"]
    assert logprobs.token_logprobs == pytest.approx(recorded)
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert logprob <= 0.0
        assert top[token] == pytest.approx(logprob)  # the sampled token is always listed
        assert 1 <= len(top) <= 4  # logprobs=3, and the sampled one when not among them
    # Each token starts where the ones before it end.
    lengths = [len(token) for token in logprobs.tokens]
    assert logprobs.text_offset == [sum(lengths[:i]) for i in range(count)]


def test_echo_prepends_the_prompt(client: openai.OpenAI, tokenizer: Any):
    completion = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, echo=True)
    choice = completion.choices[0]
    assert choice.text.startswith(PROMPT)
    ids = tokenizer.encode("The quick brown fox", add_special_tokens=False)
    from_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=2, echo=True)
    assert from_ids.choices[0].text.startswith("The quick brown fox")


def test_a_stop_sequence_ends_the_text_before_it(client: openai.OpenAI):
    greedy = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0.0}
    full = client.completions.create(**greedy).choices[0].text
    assert len(full) >= 6, full  # the tiny model writes on (fixed weights, greedy)
    stop = full[3:5]
    stopped = client.completions.create(**greedy, stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == full[: full.index(stop)]


def test_streaming_sends_the_same_text_then_usage_then_done(
    client: openai.OpenAI, server: RunningServer
):
    greedy = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0}
    whole = client.completions.create(**greedy).choices[0]
    chunks = list(
        client.completions.create(
            **greedy, stream=True, logprobs=1, stream_options={"include_usage": True}
        )
    )
    text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    assert text == whole.text
    finishes = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert finishes == [whole.finish_reason]
    tokens = [c.logprobs.tokens for chunk in chunks for c in chunk.choices if c.logprobs]
    assert len(tokens) == len((whole.model_extra or {})["token_ids"])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(tokens)
    # Recorded before [DONE], under the stream's id.
    assert record_of(server, chunks[0].id)["choices"][0]["text"] == whole.text

    raw = httpx.post(
        f"{server.url}/v1/completions", json={**greedy, "stream": True, "n": 2, "echo": True}
    )
    lines = [line for line in raw.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert '"text": "Question: What is 12 + 7?\\nAnswer:"' in lines[0]


def test_a_rollout_header_or_url_records_the_completion_into_the_rollout(
    client: openai.OpenAI, server: RunningServer
):
    by_header = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=2, extra_headers={"x-rollout-id": "plain-1"}
    )
    scoped = openai.OpenAI(
        base_url=f"{server.url}/rollouts/plain-1/v1", api_key="unused", max_retries=0
    )
    by_url = scoped.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2)
    rollout = httpx.get(f"{server.url}/v1/rollouts/plain-1").json()
    assert [record["id"] for record in rollout["completions"]] == [by_header.id, by_url.id]


# ---------------------------------------------------------------------------------- refusals


def test_suffix_is_refused_by_name(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt="def f():", suffix="return 1")
    assert refused.value.body["param"] == "suffix"
    assert "suffix" in refused.value.body["message"]


def test_echo_with_logprobs_is_refused_rather_than_invented(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=PROMPT, echo=True, logprobs=1)
    assert refused.value.body["param"] == "echo"
    assert "prompt tokens' logprobs" in refused.value.body["message"]


def test_best_of_other_than_n_is_refused(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=PROMPT, best_of=3)
    assert refused.value.body["param"] == "best_of"
    same = client.completions.create(model="tiny", prompt=PROMPT, best_of=2, n=2, max_tokens=2)
    assert len(same.choices) == 2


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"prompt": []}, "prompt", "must not be empty"),
        ({"prompt": [[1, 2], []]}, "prompt", "prompt[1] is an empty list"),
        ({"prompt": [1, "two"]}, "prompt", "mixed kinds"),
        ({"prompt": [True]}, "prompt", "integers >= 0"),
        ({"prompt": [-3]}, "prompt", "integers >= 0"),
        ({"prompt": [99_999]}, "prompt", "outside the vocabulary"),
        ({"prompt": [[1], [99_999]]}, "prompt", "prompt[1] holds token 99999"),
        ({"prompt": ""}, "prompt", "empty once tokenized"),
        ({"prompt": "x" * 1_000_000}, "prompt", "characters"),
        ({"prompt": "hi", "max_tokens": 5000}, "max_tokens", "maximum context length"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"prompt": "hi", "logprobs": 21}, "logprobs", "less than or equal to 20"),
        ({"prompt": "hi", "n": 65}, "n", "less than or equal to 64"),
        ({"prompt": ["hi"] * 8, "n": 64}, "n", "512 choices"),
        ({"prompt": "hi", "temperature": 3}, "temperature", "less than or equal to 2"),
        ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"prompt": "hi", "logit_bias": {"99999": 1}}, "logit_bias", "outside the vocabulary"),
        ({"prompt": "hi", "frobnicate": 1}, "frobnicate", "Unrecognized request argument"),
        ({}, "prompt", "Field required"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: RunningServer, body: dict[str, Any], param: str, words: str
):
    error = refusal(server, body)
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_an_unknown_model_is_a_404_and_a_body_that_is_no_object_a_400(server: RunningServer):
    error = refusal(server, {"model": "nope", "prompt": "hi"}, status=404)
    assert error["param"] == "model" and "tiny" in error["message"]
    response = httpx.post(f"{server.url}/v1/completions", content=b"[1, 2]")
    assert response.status_code == 400 and "JSON object" in response.json()["error"]["message"]


# ------------------------------------------------------- a base model's plain-text rollouts train


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a base model: no chat template."""
    return build_tiny_model(tmp_path_factory.mktemp("base-model"), chat_template=False)


@pytest.fixture(scope="module")
def base_server(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_server(base_model_dir, tmp_path_factory.mktemp("art-base")) as running:
        yield running


@pytest.fixture
async def base_backend(base_server: RunningServer) -> AsyncIterator[art.RemoteBackend]:
    backend = art.RemoteBackend(base_server.url)
    yield backend
    await backend.close()


QUESTIONS = ["What is 2 + 2?", "What is 3 + 5?"]


async def test_plain_text_rollouts_of_a_base_model_train_on_exactly_the_sampled_tokens(
    base_backend: art.RemoteBackend, base_model_dir: Path
):
    model = art.TrainableModel(name="plain", project="tests", base_model=str(base_model_dir))
    await model.register(base_backend)
    client = model.openai_client()

    async def rollout(question: str, reward: float) -> art.Trajectory:
        prompt = f"Question: {question}\nAnswer:"
        completion = await client.completions.create(
            model=model.get_inference_name(), prompt=prompt, max_tokens=6, temperature=1.0
        )
        choice = completion.choices[0]
        return art.Trajectory(
            messages_and_choices=[{"role": "user", "content": prompt}, choice], reward=reward
        )

    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(q, float(i)) for i in range(4)) for q in QUESTIONS),
        pbar_desc=None,
    )
    # One request of two prompts and n=2: its choices name their own prompts and indexes.
    prompts = [f"Question: {q}\nAnswer:" for q in QUESTIONS]
    both = await client.completions.create(
        model=model.get_inference_name(), prompt=prompts, n=2, max_tokens=5
    )
    groups.append(
        art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[choice], reward=float(choice.index))
            for choice in both.choices
        )
    )
    sampled = sum(
        len((trajectory.messages_and_choices[-1].model_extra or {})["token_ids"])
        for group in groups
        for trajectory in group.trajectories
    )
    assert groups[0].trajectories[0].messages()[-1]["role"] == "assistant"

    result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))
    metrics = result.metrics
    assert result.step == 1
    assert metrics["groups/trainable"] == 3 and metrics["rows"] == 12
    assert metrics["trained_tokens"] == sampled  # every sampled token, nothing else
    # The trainer's logprobs are the sampler's: each row holds its own prompt (a wrong one moves
    # them by ~1e-3 even on this random model).
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["logprob_abs_diff"] < 1e-4
    dropped = {key: value for key, value in metrics.items() if key.startswith("dropped/")}
    assert dropped and not any(dropped.values()), dropped

    # The new step answers plain text; chat on this base model is refused by name.
    after = await client.completions.create(
        model=model.get_inference_name(), prompt=prompts[0], max_tokens=2
    )
    assert after.model == "plain@1"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}]
        )
    assert "--chat-template" in refused.value.body["message"]


async def test_a_capture_scope_keeps_a_plain_text_completion_as_its_choice_and_trains_it(
    base_backend: art.RemoteBackend, base_model_dir: Path
):
    model = art.TrainableModel(name="captured", project="tests", base_model=str(base_model_dir))
    await model.register(base_backend)
    client = model.openai_client()
    completions = []
    async with art.trajectory_group() as group:
        for reward in range(3):
            async with art.trajectory(model=model) as trajectory:
                completion = await client.completions.create(
                    model=model.get_inference_name(), prompt=PROMPT, max_tokens=4
                )
                completions.append(completion)
                trajectory.reward = float(reward)
    assert len(group.trajectories) == 3
    for trajectory, completion in zip(group.trajectories, completions, strict=True):
        prompt, choice = trajectory.messages_and_choices
        assert prompt == {"role": "user", "content": PROMPT}
        assert isinstance(choice, CompletionChoice) and choice.text == completion.choices[0].text
        assert (choice.model_extra or {})["completion_id"] == completion.id
    result = await model.train([group])
    assert result.metrics["rows"] == 3 and result.metrics["dropped/unknown_completion"] == 0
