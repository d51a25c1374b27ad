"""The Tinker API through the real `tinker` SDK against a real art-server on the tiny model.

What the SDK's loops rely on: a training client trains with cross_entropy exactly as our own
SFT step does on the same tokens (the adapters agree to 1e-5 in float32), sampler weights sample
with the logprobs the trainer computes for the same tokens (1e-3), and bad input comes back as
the SDK's own error type carrying our message. Skipped where the SDK is not installed (the
`tinker` extra).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

tinker = pytest.importorskip(
    "tinker", reason="the tinker SDK is not installed: pip install 'art[tinker]'"
)
from tinker import types  # noqa: E402

from art_backend.training._grpo import loss_preset  # noqa: E402
from art_backend.training._optimizer import OptimizerSettings  # noqa: E402
from art_backend.training._rows import Sequence, pack_rows  # noqa: E402
from art_backend.training._trainer import LoraTrainer  # noqa: E402
from tests.support.servers import RunningServer, running_tinker_server  # noqa: E402

API_KEY = "tml-test-key"  # the SDK refuses a key without its `tml-` prefix
# AdamW with eps 1: an update then follows the gradient's size. With a tiny eps, Adam's first
# steps move every weight by +-lr whatever the loss, and a wrong loss could pass for a right one.
LEARNING_RATE, EPS = 1.0, 1.0
ADAM = types.AdamParams(
    learning_rate=LEARNING_RATE, beta1=0.9, beta2=0.99, eps=EPS, grad_clip_norm=1.0
)
OURS = OptimizerSettings(learning_rate=LEARNING_RATE, max_grad_norm=1.0, betas=(0.9, 0.99), eps=EPS)
# Two conversations: a prompt (not trained) then an answer (trained), of different lengths.
EXAMPLES = [
    (list(range(10, 22)), list(range(40, 49))),
    (list(range(100, 106)), list(range(200, 214))),
]


@pytest.fixture(scope="module")
def tinker_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("art-tinker")
    with running_tinker_server(tiny_model_dir, path, api_key=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def service(tinker_server: RunningServer) -> Iterator[tinker.ServiceClient]:
    client = tinker.ServiceClient(base_url=tinker_server.url, api_key=API_KEY)
    yield client
    client.close("success")


def datums() -> list[types.Datum]:
    """The examples in Tinker's shape: input = tokens[:-1], target = tokens[1:], and weights
    1/N on the answer's tokens (N: all trained tokens), so the summed loss is our SFT mean."""
    trained = sum(len(answer) for _, answer in EXAMPLES)
    data = []
    for prompt, answer in EXAMPLES:
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0 / trained] * len(answer)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
            )
        )
    return data


ADVANTAGES = [1.0, -0.5]  # one per example: its answer's tokens all carry it


def policy_datums(sampler_logprobs: list[list[float]]) -> list[types.Datum]:
    """The examples as RL data: the sampler's logprob and the advantage of every target token,
    the advantage divided by N (all trained tokens): Tinker sums, our presets take the mean."""
    trained = sum(len(answer) for _, answer in EXAMPLES)
    data = []
    for (prompt, answer), advantage, logprobs in zip(
        EXAMPLES, ADVANTAGES, sampler_logprobs, strict=True
    ):
        tokens = prompt + answer
        advantages = [0.0] * (len(prompt) - 1) + [advantage / trained] * len(answer)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": logprobs,
                    "advantages": advantages,
                },
            )
        )
    return data


def example_sequences(sampler_logprobs: list[list[float]] | None = None) -> list[Sequence]:
    """The examples as our own rows: the answer trained, with the sampler's logprobs."""
    sequences = []
    for number, (prompt, answer) in enumerate(EXAMPLES):
        length = len(prompt) + len(answer)
        old = [0.0] + sampler_logprobs[number] if sampler_logprobs else [0.0] * length
        sequences.append(
            Sequence(
                input_ids=torch.tensor(prompt + answer),
                trained_mask=torch.tensor([False] * len(prompt) + [True] * len(answer)),
                old_logprobs=torch.tensor(old)
                * torch.tensor([0.0] * len(prompt) + [1.0] * len(answer)),
                advantage=ADVANTAGES[number],
                trajectory_id=str(number),
                group_id=number,
                truncated=False,
            )
        )
    return sequences


def our_sft_adapter(
    server: RunningServer, lora: dict, seed: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Three of our own SFT steps on the same tokens, from the same LoRA initialisation: the
    adapter before and after."""
    rows, _ = pack_rows(example_sequences(), max_length=2048, mask_truncated=False)
    trainer = LoraTrainer(server.app.state.training.trainer_host, "reference", lora, seed=seed)
    try:
        before = [param.detach().clone() for param in trainer.params]
        for _ in range(3):
            trainer.sft_step(rows, OURS)
        return before, [param.detach().clone() for param in trainer.params]
    finally:
        trainer.close()


def test_three_sdk_steps_train_the_adapter_our_sft_step_trains(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    training = service.create_lora_training_client(base_model="tiny", rank=8, seed=7).result()
    losses = []
    for _ in range(3):
        backward = training.forward_backward(datums(), "cross_entropy")
        step = training.optim_step(ADAM)
        losses.append(backward.result().metrics["loss:sum"])
        assert step.result().metrics["grad_norm"] > 0
    assert losses[2] < losses[1] < losses[0]

    registered = tinker_server.app.state.training.registry.get("tinker", training.model_id)
    before, ours = our_sft_adapter(tinker_server, registered.lora, seed=7)
    moved = largest_difference(before, ours)
    difference = largest_difference(registered.trainer.params, ours)
    print(f"adapter: moved {moved:.2e} in 3 steps; Tinker API vs our SFT step {difference:.2e}")
    assert moved > 1e-3 and difference < 1e-5


# Tinker's loss (its loss_fn_config) and the preset of ours it must equal.
POLICY_LOSSES = {
    "importance_sampling": ({}, loss_preset("ppo", eps_low=float("inf"), eps_high=float("inf"))),
    "ppo": ({}, loss_preset("ppo")),  # Tinker's 0.8 / 1.2 are our ppo preset's 0.2 / 0.2
    "cispo": ({"clip_low_threshold": 0.0, "clip_high_threshold": 5.0}, loss_preset("cispo")),
}


@pytest.mark.parametrize("loss_fn", list(POLICY_LOSSES))
def test_three_sdk_steps_of_a_policy_loss_train_what_our_preset_trains(
    loss_fn: str, service: tinker.ServiceClient, tinker_server: RunningServer
):
    config, preset = POLICY_LOSSES[loss_fn]
    training = service.create_lora_training_client(base_model="tiny", rank=8, seed=5).result()
    # The sampler's logprobs: the model's own, moved so that some ratios leave [0.8, 1.2].
    scored = training.forward(datums(), "cross_entropy").result().loss_fn_outputs
    sampler = [
        [value + 0.4 * math.sin(3 * t) for t, value in enumerate(out["logprobs"].tolist())]
        for out in scored
    ]
    for _ in range(3):
        backward = training.forward_backward(policy_datums(sampler), loss_fn, loss_fn_config=config)
        training.optim_step(ADAM).result()
        assert backward.result().metrics["loss:sum"] != 0

    registered = tinker_server.app.state.training.registry.get("tinker", training.model_id)
    rows, _ = pack_rows(example_sequences(sampler), max_length=2048, mask_truncated=False)
    engine = tinker_server.app.state.training.trainer_host
    trainer = LoraTrainer(engine, "reference", registered.lora, seed=5)
    try:
        before = [param.detach().clone() for param in trainer.params]
        for _ in range(3):
            trainer.grpo_step(rows, preset, OURS, beta=0.0)
        moved = largest_difference(before, trainer.params)
        difference = largest_difference(registered.trainer.params, trainer.params)
    finally:
        trainer.close()
    print(f"{loss_fn}: moved {moved:.2e}; Tinker API vs our preset {difference:.2e}")
    assert moved > 1e-3 and difference < 1e-5


def test_gradients_add_up_until_optim_step(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    registry = tinker_server.app.state.training.registry
    together = service.create_lora_training_client(base_model="tiny", rank=8, seed=2).result()
    apart = service.create_lora_training_client(base_model="tiny", rank=8, seed=2).result()
    for _ in range(2):
        together.forward_backward(datums(), "cross_entropy")
        together.optim_step(ADAM).result()
        first, second = datums()
        apart.forward_backward([first], "cross_entropy")
        apart.forward_backward([second], "cross_entropy")
        apart.optim_step(ADAM).result()
    difference = largest_difference(
        registry.get("tinker", together.model_id).trainer.params,
        registry.get("tinker", apart.model_id).trainer.params,
    )
    assert difference < 1e-6


def test_a_saved_state_loads_with_or_without_its_optimizer(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    runs = tinker_server.app.state.tinker.runs

    def adapter(client: tinker.TrainingClient) -> list[torch.Tensor]:
        return [p.detach().clone() for p in runs[client.model_id].registered.trainer.params]

    def one_step(client: tinker.TrainingClient) -> None:
        client.forward_backward(datums(), "cross_entropy")
        client.optim_step(ADAM).result()

    original = service.create_lora_training_client(base_model="tiny", rank=8, seed=4).result()
    one_step(original)
    path = original.save_state("after-one-step").result().path
    assert path == f"tinker://{original.model_id}/weights/after-one-step"
    saved = adapter(original)
    one_step(original)

    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert largest_difference(adapter(resumed), saved) == 0
    one_step(resumed)  # with the saved optimizer moments: the step the original took
    assert largest_difference(adapter(resumed), adapter(original)) < 1e-6

    fresh = service.create_training_client_from_state(path).result()
    assert largest_difference(adapter(fresh), saved) == 0
    one_step(fresh)  # fresh moments: another step
    assert largest_difference(adapter(fresh), adapter(original)) > 1e-3

    with pytest.warns(FutureWarning):  # load_state: deprecated by the SDK, still served
        original.load_state(path).result()
    assert largest_difference(adapter(original), saved) == 0
    with pytest.raises(tinker.NotFoundError, match="No saved state"):
        original.load_state("tinker://nothing/weights/here").result()
    one_step(original)  # the refused load took its turn

    with pytest.raises(tinker.BadRequestError, match="exists; save with overwrite=True"):
        original.save_state("after-one-step").result()
    with pytest.raises(tinker.NotFoundError, match="No saved state"):
        service.create_training_client_from_state("tinker://nothing/weights/here").result()


def largest_difference(first: list[torch.Tensor], second: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(first, second, strict=True))


def test_sampler_weights_sample_with_the_trainers_logprobs(service: tinker.ServiceClient):
    training = service.create_lora_training_client(base_model="tiny", rank=8, seed=1).result()
    training.forward_backward(datums(), "cross_entropy")
    training.optim_step(ADAM).result()
    path = training.save_weights_for_sampler("after-one-step").result().path
    assert path == f"tinker://{training.model_id}/sampler_weights/after-one-step"

    sampler = service.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints(EXAMPLES[0][0])
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=11)
    response = sampler.sample(prompt, num_samples=2, sampling_params=params).result()
    assert len(response.sequences) == 2
    again = sampler.sample(prompt, num_samples=2, sampling_params=params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in response.sequences]

    differences = []
    for sequence in response.sequences:
        assert 1 <= len(sequence.tokens) <= 8 and sequence.stop_reason in ("stop", "length")
        assert sequence.logprobs is not None and len(sequence.logprobs) == len(sequence.tokens)
        tokens = EXAMPLES[0][0] + sequence.tokens
        scored = training.forward(
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:]},
                )
            ],
            "cross_entropy",
        ).result()
        trainer_logprobs = scored.loss_fn_outputs[0]["logprobs"].tolist()[-len(sequence.tokens) :]
        differences += [
            abs(a - b) for a, b in zip(sequence.logprobs, trainer_logprobs, strict=True)
        ]
    print(f"sampler vs trainer logprobs, largest difference: {max(differences):.2e}")
    assert max(differences) < 1e-3

    # The cookbook's RL loops save unnamed weights and sample from them at once.
    latest = training.save_weights_and_get_sampling_client().result()
    assert latest.sample(prompt, 1, params).result().sequences[0].tokens


def test_a_sampler_checkpoints_history_row_carries_the_training_since_the_last_one(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    """What the history shows: each sampler checkpoint's history row has the
    summed loss, the datums and tokens scored, the optimizer steps and the last gradient norm
    since the checkpoint before it; a forward without backward counts for nothing."""
    metadata = {"art_project": "tinker-tests", "art_name": "tallied"}
    training = service.create_lora_training_client(
        base_model="tiny", rank=4, seed=2, user_metadata=metadata
    ).result()
    losses = [
        training.forward_backward(datums(), "cross_entropy").result().metrics["loss:sum"]
        for _ in range(2)
    ]
    training.forward(datums(), "cross_entropy").result()
    grad_norm = training.optim_step(ADAM).result().metrics["grad_norm"]
    training.save_weights_for_sampler("first").result()
    training.save_weights_for_sampler("second").result()  # nothing trained in between

    response = httpx.get(
        f"{tinker_server.url}/v1/training/models/tinker-tests/tallied/history",
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    response.raise_for_status()
    rows = [row for row in response.json()["rows"] if row.get("type") == "tinker_sampler"]
    assert [row["step"] for row in rows] == [1, 2]
    first, second = rows[0]["metrics"], rows[1]["metrics"]
    tokens = sum(len(prompt) + len(answer) - 1 for prompt, answer in EXAMPLES)
    assert first["loss"] == pytest.approx(sum(losses), rel=1e-5)
    assert (first["datums"], first["trained_tokens"]) == (2 * len(EXAMPLES), 2 * tokens)
    assert first["optim_steps"] == 1 and first["grad_norm"] == pytest.approx(grad_norm)
    assert first["learning_rate"] == LEARNING_RATE
    assert second == {}


def test_an_older_sampler_step_is_served_again_until_the_windows_next_trim(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    engine = tinker_server.app.state.service.engine
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    path = training.save_weights_for_sampler("first").result().path  # step 1
    for name in ("second", "third"):  # steps 2 and 3: the window (2 steps) drops step 1
        training.save_weights_for_sampler(name).result()
    first = f"{training.model_id}@1"
    assert first not in engine.adapters
    sampler = service.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints([5, 6, 7])
    assert sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result().sequences
    assert first in engine.adapters  # served again for the sampler
    training.save_weights_for_sampler("fourth").result()
    assert first not in engine.adapters  # and unloaded by the window's next trim


def test_bad_input_is_the_sdks_error_with_our_message(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    assert training.get_tokenizer().encode("hello")  # the served model's own tokenizer
    with pytest.raises(
        tinker.BadRequestError, match=r"'custom' is not served.*Served: cross_entropy"
    ):
        training.forward_backward(datums(), "custom").result()
    with pytest.raises(tinker.BadRequestError, match="clip_low_threshold <= 1"):
        training.forward_backward(
            policy_datums([[0.0] * 20, [0.0] * 19]),
            "ppo",
            loss_fn_config={"clip_low_threshold": 1.5, "clip_high_threshold": 2.0},
        ).result()
    outside = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 100_000]),
        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]},
    )
    with pytest.raises(tinker.BadRequestError, match=r"\[100000\] outside the vocabulary"):
        training.forward_backward([outside], "cross_entropy").result()
    wrong_shape = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0]},
    )
    with pytest.raises(tinker.BadRequestError, match=r"'weights'\] has shape \[2\]"):
        training.forward_backward([wrong_shape], "cross_entropy").result()
    # The refused operations took their turns: the next one runs.
    assert training.forward_backward(datums(), "cross_entropy").result().metrics["loss:sum"] > 0
    with pytest.raises(tinker.BadRequestError, match="serves base model 'tiny'"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
    sampler = service.create_sampling_client(base_model="tiny").result()
    params = types.SamplingParams(max_tokens=4)
    with pytest.raises(tinker.BadRequestError, match="outside the vocabulary"):
        sampler.sample(types.ModelInput.from_ints([5, 100_000]), 1, params).result()
    # Stop token ids: the model's own end token (a renderer's usual stop) is served, others not.
    end_token = tinker_server.app.state.service.engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = types.ModelInput.from_ints([5, 6, 7])
    for stop in ([end_token], ["Answer:"]):
        stopping = types.SamplingParams(max_tokens=4, stop=stop)
        assert sampler.sample(prompt, 1, stopping).result().sequences
    with pytest.raises(tinker.BadRequestError, match=r"Stop token ids \[7\] are not served yet"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, stop=[7])).result()
    with pytest.raises(tinker.BadRequestError, match="prompt_alt_tokens_k"):
        sampler.sample(prompt, 1, params, prompt_alt_tokens_k=2).result()


@pytest.mark.parametrize(
    ("loss", "key", "value"),
    [
        ("cross_entropy", "weights", math.nan),
        ("importance_sampling", "advantages", math.inf),
        ("importance_sampling", "logprobs", math.inf),  # once a loss of 0 that trained nothing
    ],
)
def test_a_datum_that_is_not_finite_is_refused_and_the_run_still_trains_and_saves(
    service: tinker.ServiceClient, loss: str, key: str, value: float
):
    """Nothing non-finite reaches a gradient or a saved file: the datum is a 400 naming it and
    its key, good data accumulated before it is kept, and the run's sampler weights save."""
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    good = datums() if loss == "cross_entropy" else policy_datums([[-1.0] * 20, [-1.0] * 19])
    assert training.forward_backward(good, loss).result().metrics["loss:sum"] != 0
    inputs = {name: tensor.tolist() for name, tensor in good[1].loss_fn_inputs.items()}
    inputs[key][3] = value
    bad = types.Datum(model_input=good[1].model_input, loss_fn_inputs=inputs)
    with pytest.raises(tinker.BadRequestError, match=rf"data\[1\]: loss_fn_inputs\['{key}'\]"):
        training.forward_backward([good[0], bad], loss).result()
    metrics = training.optim_step(ADAM).result().metrics
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    saved = training.save_weights_for_sampler(name=f"after-{key}").result()
    assert saved.path.endswith(f"/sampler_weights/after-{key}")


def test_an_operation_sent_again_gets_its_first_answer(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    url, headers = f"{tinker_server.url}/api/v1/optim_step", {"X-API-Key": API_KEY}
    body = {"adam_params": {"learning_rate": 1e-4}, "model_id": training.model_id, "seq_id": 1}
    first = httpx.post(url, json=body, headers=headers).json()["request_id"]
    assert httpx.post(url, json=body, headers=headers).json()["request_id"] == first
    other = httpx.post(url, json={**body, "adam_params": {"learning_rate": 1.0}}, headers=headers)
    assert other.status_code == 400
    assert "sent before with another body" in other.json()["detail"]


def test_a_refused_save_weights_for_sampler_does_not_hold_the_runs_next_operation(
    service: tinker.ServiceClient, tinker_server: RunningServer
):
    training = service.create_lora_training_client(base_model="tiny", rank=4).result()
    api, headers = f"{tinker_server.url}/api/v1", {"X-API-Key": API_KEY}
    model_id = training.model_id
    refusals = [
        ({"model_id": model_id, "seq_id": 1}, "Give a sampler name"),
        ({"model_id": model_id, "seq_id": 2, "path": "x", "kind": "other"}, "kind 'other'"),
    ]
    for body, message in refusals:
        answer = httpx.post(f"{api}/save_weights_for_sampler", json=body, headers=headers)
        assert answer.status_code == 400
        assert message in answer.json()["detail"]
    body = {"model_id": model_id, "seq_id": 3, "path": "after-refusals"}
    started = httpx.post(f"{api}/save_weights_for_sampler", json=body, headers=headers).json()
    deadline = time.monotonic() + 120
    while True:
        outcome = httpx.post(
            f"{api}/retrieve_future", json={"request_id": started["request_id"]}, headers=headers
        ).json()
        if outcome.get("type") != "try_again":
            break
        assert time.monotonic() < deadline, "the refused operations held the run's next one"
        time.sleep(0.1)
    assert outcome["path"] == f"tinker://{model_id}/sampler_weights/after-refusals"


def test_routes_not_served_yet_are_refused_by_name(tinker_server: RunningServer):
    answer = httpx.post(
        f"{tinker_server.url}/api/v1/save_weights_external", json={}, headers={"X-API-Key": API_KEY}
    )
    assert answer.status_code == 404
    assert (
        "/api/v1/save_weights_external is not served by this server yet" in answer.json()["detail"]
    )
    assert "forward_backward" in answer.json()["detail"]


def test_the_api_key_is_the_servers(tinker_server: RunningServer):
    with pytest.raises(tinker.AuthenticationError, match="TINKER_API_KEY = art-server's --api-key"):
        tinker.ServiceClient(
            base_url=tinker_server.url, api_key="tml-wrong"
        ).create_lora_training_client(base_model="tiny", rank=4)
