"""Logprobs through the real `tinker` SDK: `compute_logprobs`, `include_prompt_logprobs`,
`topk_prompt_logprobs`, `prompt_logprobs_last_n` and `topk_sample_logprobs`, against a real
art-server on the tiny model.

The prompt is scored by the trainer's forward, so `compute_logprobs` on sampler weights is the
number `TrainingClient.forward` gives for the same tokens, and on the base model it is the base
model's (a KL penalty's reference).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

from tests.support.servers import running_tinker_server  # noqa: E402

API_KEY = "tml-test-key"
PROMPT = [5, 17, 230, 41, 99, 8, 150, 64, 12, 77]
ADAM = types.AdamParams(learning_rate=0.5, beta1=0.9, beta2=0.99, eps=1.0)


@pytest.fixture(scope="module")
def service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tinker.ServiceClient]:
    path = tmp_path_factory.mktemp("art-tinker-prompt-logprobs")
    with running_tinker_server(tiny_model_dir, path, api_key=API_KEY) as running:
        client = tinker.ServiceClient(base_url=running.url, api_key=API_KEY)
        yield client
        client.close("success")


@pytest.fixture(scope="module")
def trained(service: tinker.ServiceClient) -> tuple[tinker.TrainingClient, str]:
    """A run one step away from the base model, and its sampler weights' path."""
    training = service.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT[:-1]),
        loss_fn_inputs={"target_tokens": PROMPT[1:], "weights": [1.0] * (len(PROMPT) - 1)},
    )
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(ADAM).result()
    return training, training.save_weights_for_sampler("one-step").result().path


def trainer_logprobs(training: tinker.TrainingClient, tokens: list[int]) -> list[float]:
    """What `forward` gives for each token after the first."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:]},
    )
    return (
        training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    )


def test_compute_logprobs_is_the_trainers_forward_on_the_samplers_weights(
    service: tinker.ServiceClient, trained: tuple[tinker.TrainingClient, str]
):
    training, path = trained
    sampler = service.create_sampling_client(model_path=path).result()
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
    assert len(logprobs) == len(PROMPT) and logprobs[0] is None
    scored = [float(value) for value in logprobs[1:] if value is not None]
    assert len(scored) == len(PROMPT) - 1 and all(value < 0 for value in scored)
    expected = trainer_logprobs(training, PROMPT)
    assert max(abs(a - b) for a, b in zip(scored, expected, strict=True)) < 1e-5

    # The base model's sampler scores with the base model: the trained step moved these tokens.
    base = service.create_sampling_client(base_model="tiny").result()
    base_logprobs = base.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
    moved = [abs(a - b) for a, b in zip(base_logprobs[1:], scored, strict=True)]  # type: ignore[operator]
    assert max(moved) > 1e-3


def test_prompt_logprobs_last_n_scores_only_the_last_tokens(
    service: tinker.ServiceClient, trained: tuple[tinker.TrainingClient, str]
):
    sampler = service.create_sampling_client(model_path=trained[1]).result()
    prompt = types.ModelInput.from_ints(PROMPT)
    whole = sampler.compute_logprobs(prompt).result()
    last = sampler.compute_logprobs(prompt, prompt_logprobs_last_n=3).result()
    assert last[:-3] == [None] * (len(PROMPT) - 3)
    assert last[-3:] == pytest.approx(whole[-3:], abs=1e-5)


def test_top_k_prompt_logprobs_rank_each_positions_most_likely_tokens(
    service: tinker.ServiceClient,
):
    sampler = service.create_sampling_client(base_model="tiny").result()
    params = types.SamplingParams(max_tokens=2, seed=1)
    response = sampler.sample(
        types.ModelInput.from_ints(PROMPT),
        1,
        params,
        include_prompt_logprobs=True,
        topk_prompt_logprobs=4,
    ).result()
    assert len(response.sequences[0].tokens) >= 1  # the sample is still there
    prompt_logprobs, top = response.prompt_logprobs, response.topk_prompt_logprobs
    assert prompt_logprobs is not None and top is not None and len(top) == len(PROMPT)
    assert top[0] is None
    for position, ranked in enumerate(top[1:], start=1):
        assert ranked is not None and len(ranked) == 4
        values = [value for _, value in ranked]
        assert values == sorted(values, reverse=True) and math.exp(values[0]) <= 1.0
        actual = prompt_logprobs[position]
        assert actual is not None and actual <= values[0] + 1e-6
        for token, value in ranked:
            if token == PROMPT[position]:
                assert value == pytest.approx(actual, abs=1e-5)


def test_a_prompt_logprobs_last_n_longer_than_the_prompt_is_refused_by_name(
    service: tinker.ServiceClient,
):
    sampler = service.create_sampling_client(base_model="tiny").result()
    with pytest.raises(tinker.BadRequestError, match=r"prompt_logprobs_last_n is 10.*at most 9"):
        sampler.compute_logprobs(
            types.ModelInput.from_ints(PROMPT), prompt_logprobs_last_n=10
        ).result()


def test_top_k_sample_logprobs_rank_each_sampled_positions_most_likely_tokens(
    service: tinker.ServiceClient, trained: tuple[tinker.TrainingClient, str]
):
    sampler = service.create_sampling_client(model_path=trained[1]).result()
    params = types.SamplingParams(max_tokens=6, seed=2, temperature=1.0)
    prompt = types.ModelInput.from_ints(PROMPT)
    response = sampler.sample(prompt, 2, params, topk_sample_logprobs=3).result()
    assert response.topk_prompt_logprobs is None  # the prompt's were not asked for
    for sequence in response.sequences:
        top = sequence.topk_logprobs
        assert top is not None and len(top) == len(sequence.tokens) >= 1
        for token, logprob, ranked in zip(sequence.tokens, sequence.logprobs, top, strict=True):
            assert ranked is not None and len(ranked) == 3
            values = [value for _, value in ranked]
            assert values == sorted(values, reverse=True) and logprob <= values[0] + 1e-5
            for ranked_token, value in ranked:
                if ranked_token == token:
                    assert value == pytest.approx(logprob, abs=1e-5)
    plain = sampler.sample(prompt, 1, params).result().sequences[0]
    assert plain.topk_logprobs is None
    for k in (-1, 21):  # OpenAI's top_logprobs bound, 20
        with pytest.raises(tinker.BadRequestError, match="topk_sample_logprobs"):
            sampler.sample(prompt, 1, params, topk_sample_logprobs=k).result()
