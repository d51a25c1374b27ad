"""The losses `dro`, `gspo` and `stable_reinforce`, and samplers' `record_stability_info`, through
the real `tinker` SDK against a real art-server on the tiny model.

Each loss answers, per datum, the trainer's logprobs and the elementwise loss; the tests check
the elementwise loss against the formula of Tinker's page (`training._losses`' docstring) written
out here from those logprobs, then that a step of it moves the adapter. `stable_reinforce` trains
on sequences a sampler recorded, named by provenance as the cookbook's `rl_loop` names them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

from tests.support.servers import running_tinker_server  # noqa: E402

API_KEY = "tml-test-key"
PROMPT = list(range(10, 16))
ANSWER = list(range(40, 48))
ADVANTAGE = 0.5


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    path = tmp_path_factory.mktemp("art-tinker-losses")
    with running_tinker_server(tiny_model_dir, path, api_key=API_KEY) as running:
        client = tinker.ServiceClient(base_url=running.url, api_key=API_KEY)
        yield client
        client.close("success")


@pytest.fixture(scope="module")
def training(service):
    return service.create_lora_training_client(base_model="tiny", rank=4).result()


def policy_datum(sampler_logprobs: list[float], **extra: list[float]) -> types.Datum:
    """A prompt (not trained: advantage 0) then an answer with the sampler's logprobs."""
    tokens = PROMPT + ANSWER
    advantages = [0.0] * (len(PROMPT) - 1) + [ADVANTAGE] * len(ANSWER)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": sampler_logprobs,
            "advantages": advantages,
            **extra,
        },
    )


def answer(result) -> tuple[torch.Tensor, torch.Tensor]:
    """The first datum's trainer logprobs and elementwise loss."""
    output = result.loss_fn_outputs[0]
    return output["logprobs"].to_torch(), output["elementwise_loss"].to_torch()


def sampler_logprobs(shift: float) -> list[float]:
    return [0.0] * (len(PROMPT) - 1) + [-3.0 + shift * i for i in range(len(ANSWER))]


def test_dro_is_the_policy_gradient_less_a_quadratic_pull_to_the_sampler(training):
    q = torch.tensor(sampler_logprobs(0.1))
    advantages = torch.tensor(policy_datum(q.tolist()).loss_fn_inputs["advantages"].tolist())
    for config, beta in ((None, 0.05), ({"beta": 0.3}, 0.3)):
        result = training.forward([policy_datum(q.tolist())], "dro", loss_fn_config=config).result()
        lp, loss = answer(result)
        expected = -(lp * advantages - 0.5 * beta * (lp - q) ** 2)
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
        assert result.metrics["loss:sum"] == pytest.approx(float(expected.sum()), rel=1e-4)


def test_gspo_clips_the_sequence_ratio_over_the_masked_tokens(training):
    q = torch.tensor(sampler_logprobs(0.0))
    advantages = torch.tensor(policy_datum(q.tolist()).loss_fn_inputs["advantages"].tolist())
    mask = [0.0] * (len(PROMPT) - 1) + [1.0] * len(ANSWER)
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    datum = policy_datum(q.tolist(), sequence_ratio_mask=mask)
    lp, loss = answer(training.forward([datum], "gspo", loss_fn_config=config).result())
    marked = torch.tensor(mask) != 0
    ratio = torch.exp((lp - q)[marked].mean())  # one value for every token
    expected = -torch.minimum(ratio * advantages, ratio.clamp(0.9, 1.1) * advantages)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert abs(float(ratio) - 1.0) > 0.1  # the clip is met: the test tells PPO from its absence


def rl_loop_datum(prompt: list[int], sequence: types.SampledSequence) -> types.Datum:
    """A sampled sequence as the cookbook's rl_loop trains it: prompt targets 0, then the
    sampled tokens, with provenance naming the sequence behind every position."""
    sampled = list(sequence.tokens)
    observed = len(prompt) - 1
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(prompt + sampled[:-1]),
        loss_fn_inputs={
            "target_tokens": [0] * observed + sampled,
            "logprobs": [0.0] * observed + [-1.0] * len(sampled),  # the recorded ones win
            "advantages": [ADVANTAGE] * (observed + len(sampled)),  # prompt ones count 0
        },
    )
    return datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence.sequence_id, length=len(prompt)),
            types.SampledProvenanceSpan(sequence_id=sequence.sequence_id, length=len(sampled) - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(
                sequence_id=sequence.sequence_id, offset=1, length=len(prompt) - 1
            ),
            types.SampledProvenanceSpan(sequence_id=sequence.sequence_id, length=len(sampled)),
        ],
    )


def sample(sampler, seed: int) -> types.SampledSequence:
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=seed)
    prompt = types.ModelInput.from_ints(PROMPT)
    return sampler.sample(prompt, 1, params).result().sequences[0]


def test_stable_reinforce_trains_the_recorded_samples_with_truncated_weights(training):
    sampler = training.save_weights_and_get_sampling_client(record_stability_info=True).result()
    sequence = sample(sampler, seed=1)
    assert sequence.sequence_id and len(sequence.tokens) >= 2
    datum = rl_loop_datum(PROMPT, sequence)
    result = training.forward_backward([datum], "stable_reinforce").result()
    lp, loss = answer(result)
    observed = len(PROMPT) - 1
    q = torch.tensor(sequence.logprobs)
    weight = torch.exp(lp[observed:] - q).clamp(0.0, 2.0)
    torch.testing.assert_close(
        loss[observed:], -weight * ADVANTAGE * lp[observed:], rtol=1e-4, atol=1e-5
    )
    assert torch.all(loss[:observed] == 0)  # prompt positions: not sampled, not trained
    before = answer(training.forward([datum], "stable_reinforce").result())[0]
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = answer(training.forward([datum], "stable_reinforce").result())[0]
    assert float((after - before)[observed:].sum()) > 0  # a positive advantage: more likely


def test_a_two_turn_datum_trains_both_turns_sampled_tokens_and_not_the_observation(training):
    """The cookbook's multi-turn datum: turn 2's prompt is turn 1's prompt, its sample and an
    observation; provenance names each run (as `rl.data_processing.trajectory_to_data` does)."""
    sampler = training.save_weights_and_get_sampling_client(record_stability_info=True).result()
    first = sample(sampler, seed=4)
    observation = [50, 51]
    second_prompt = PROMPT + list(first.tokens) + observation
    second = (
        sampler.sample(
            types.ModelInput.from_ints(second_prompt), 1, types.SamplingParams(max_tokens=4, seed=5)
        )
        .result()
        .sequences[0]
    )
    tokens = second_prompt + list(second.tokens)
    turns = (len(PROMPT) - 1, len(first.tokens), len(observation), len(second.tokens))
    advantages = [0.0] * turns[0] + [ADVANTAGE] * turns[1] + [0.0] * turns[2]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "advantages": advantages + [ADVANTAGE] * turns[3],
        },
    ).with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=first.sequence_id, length=len(PROMPT)),
            types.SampledProvenanceSpan(sequence_id=first.sequence_id, length=turns[1]),
            types.PromptProvenanceSpan(
                sequence_id=second.sequence_id, offset=len(PROMPT) + turns[1], length=turns[2]
            ),
            types.SampledProvenanceSpan(sequence_id=second.sequence_id, length=turns[3] - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(
                sequence_id=first.sequence_id, offset=1, length=len(PROMPT) - 1
            ),
            types.SampledProvenanceSpan(sequence_id=first.sequence_id, length=turns[1]),
            types.PromptProvenanceSpan(
                sequence_id=second.sequence_id, offset=len(PROMPT) + turns[1], length=turns[2]
            ),
            types.SampledProvenanceSpan(sequence_id=second.sequence_id, length=turns[3]),
        ],
    )
    lp, loss = answer(training.forward([datum], "stable_reinforce").result())
    q = torch.tensor(list(first.logprobs) + [0.0] * turns[2] + list(second.logprobs))
    sampled = torch.tensor([1.0] * turns[1] + [0.0] * turns[2] + [1.0] * turns[3])
    scored = lp[turns[0] :]
    weight = torch.exp(scored - q).clamp(0.0, 2.0)
    expected = -weight * ADVANTAGE * scored * sampled
    torch.testing.assert_close(loss[turns[0] :], expected, rtol=1e-4, atol=1e-5)
    assert torch.all(loss[: turns[0]] == 0)


def test_stable_reinforce_refuses_data_without_a_recorded_provenance(training):
    sampler = training.save_weights_and_get_sampling_client().result()  # records nothing
    sequence = sample(sampler, seed=2)
    plain = rl_loop_datum(PROMPT, sequence)
    with pytest.raises(tinker.BadRequestError, match="no stability record"):
        training.forward_backward([plain], "stable_reinforce").result()
    bare = types.Datum(model_input=plain.model_input, loss_fn_inputs=plain.loss_fn_inputs)
    with pytest.raises(tinker.BadRequestError, match=r"data\[0\] carries no provenance"):
        training.forward_backward([bare], "stable_reinforce").result()

    recorder = training.save_weights_and_get_sampling_client(record_stability_info=True).result()
    recorded = sample(recorder, seed=3)
    datum = rl_loop_datum(PROMPT, recorded)
    targets = datum.loss_fn_inputs["target_tokens"].tolist()
    targets[-1] = (targets[-1] + 1) % 50
    forged = types.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={**datum.loss_fn_inputs, "target_tokens": targets},
    ).with_provenance(model_input=datum.model_input_spans, loss_fn_inputs=datum.loss_fn_input_spans)
    with pytest.raises(tinker.BadRequestError, match=r"are not sequence .* sampled tokens"):
        training.forward_backward([forged], "stable_reinforce").result()


def test_bad_loss_settings_are_named(training):
    datum = policy_datum(sampler_logprobs(0.0))
    with pytest.raises(tinker.BadRequestError, match="beta must be at least 0"):
        training.forward([datum], "dro", loss_fn_config={"beta": -1.0}).result()
    with pytest.raises(tinker.BadRequestError, match=r"'custom' is not served.*Served: .*dro"):
        training.forward([datum], "custom").result()
