"""A Tinker request's datums on the training core: checked (`tinker._datums`), laid out as the
trainer's one row type, grouped by shared prefix (`_packing.prefix_groups`), and scored by the
one `forward_backward`, packed or padded, with the same logprobs, losses and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from art_backend._errors import InvalidRequestError
from art_backend.tinker._datums import datum_rows
from art_backend.tinker._proto import ForwardBackwardWire, WireDatum, WireTensor
from art_backend.training._losses import LOSSES, DatumLoss
from art_backend.training._packing import PackedBatch, packed_micro_batches, prefix_groups
from tests.support.trainers import twin_trainers

SYSTEM = [5, 6, 7, 8, 9, 10]  # a system prompt every row begins with
VOCABULARY, CONTEXT = 128, 256


def datum(tokens: list[int], **inputs: list[float]) -> WireDatum:
    """The cookbook's datum of a sequence: inputs tokens[:-1], targets tokens[1:]."""
    tensors = {
        name: WireTensor(np.array(values, dtype=np.float32)) for name, values in inputs.items()
    }
    tensors["target_tokens"] = WireTensor(np.array(tokens[1:], dtype=np.int64))
    return WireDatum(tokens=tokens[:-1], inputs=tensors)


def request(data: list[WireDatum], loss_fn: str = "cross_entropy") -> ForwardBackwardWire:
    return ForwardBackwardWire("run", 1, loss_fn, {}, False, data)


def cookbook_sequences() -> list[list[int]]:
    """Two prompts' samples, interleaved as a caller may send them, and an unrelated row."""
    first = [
        [*SYSTEM, 20, 21, 22, 23, 24, *c]
        for c in ([40, 41, 42], [40, 43], [44, 45, 46, 47], [48, 49])
    ]
    second = [[*SYSTEM, 30, 31, 32, 33, *c] for c in ([50, 51], [52, 53, 54], [55, 56, 57])]
    lone = [60, 61, 62, 63, 64, 65, 66]
    return [first[0], second[0], first[1], lone, second[1], first[2], second[2], first[3]]


def rows_of(sequences: list[list[int]], **inputs: object):
    wire = request([datum(s) for s in sequences])
    return datum_rows(wire, LOSSES["cross_entropy"], vocabulary=VOCABULARY, context=CONTEXT)


def test_a_datum_becomes_a_row_that_scores_its_own_targets_from_position_one():
    wire = request([datum([1, 2, 3, 4], weights=[0.0, 1.0, 2.0])])
    rows = datum_rows(wire, LOSSES["cross_entropy"], vocabulary=VOCABULARY, context=CONTEXT)
    assert rows.input_ids.tolist() == [[1, 2, 3, 4]]  # the inputs, then the last target
    assert rows.target_ids is not None and rows.target_ids.tolist() == [[0, 2, 3, 4]]
    assert rows.trained_mask.tolist() == [[False, True, True, True]]
    assert rows.token_inputs["weights"].tolist() == [[0.0, 0.0, 1.0, 2.0]]
    assert rows.trajectory_ids == ["0"]


def test_a_prompts_samples_form_one_group_and_a_shorter_common_prefix_does_not_merge_prompts():
    groups = prefix_groups([s[:-1] for s in cookbook_sequences()])
    members: dict[int, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    assert sorted(members.values()) == [[0, 2, 5, 7], [1, 4, 6], [3]]
    # Rows sharing only one token group when that packs fewer tokens (1 + 3 + 3 < 4 + 4).
    assert len(set(prefix_groups([[1, 2, 3, 4], [1, 9, 9, 9]]))) == 1
    assert len(set(prefix_groups([[1, 2, 3], [7, 2, 3]]))) == 2


def test_a_group_shares_its_whole_prefix_scored_positions_included_within_the_budget():
    rows = rows_of(cookbook_sequences())
    (batch,) = packed_micro_batches(rows, token_budget=1000, share_trained=True)
    assert isinstance(batch, PackedBatch)
    assert batch.processed_tokens < int(rows.attention_mask.sum())
    # GRPO's rule stops a prefix at the first scored token: position 1, one token shared.
    (grpo_rule,) = packed_micro_batches(rows, token_budget=1000)
    assert isinstance(grpo_rule, PackedBatch)
    assert batch.processed_tokens < grpo_rule.processed_tokens - 20
    small = packed_micro_batches(rows, token_budget=24, share_trained=True)
    assert all(b.input_ids.numel() <= 24 or b.input_ids.shape[0] == 1 for b in small)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"weights": [1.0, math.nan, 1.0]},
            r"data\[1\]: loss_fn_inputs\['weights'\] holds nan at position 1",
        ),
        (
            {"weights": [1.0, 1.0, math.inf]},
            r"data\[1\]: loss_fn_inputs\['weights'\] holds inf at position 2",
        ),
        ({"weights": [1.0, 1.0]}, r"data\[1\]: loss_fn_inputs\['weights'\] has shape \[2\]"),
    ],
)
def test_a_datum_that_cannot_be_trained_as_sent_is_refused_by_name(inputs, message):
    wire = request([datum([1, 2, 3, 4]), datum([1, 2, 3, 4], **inputs)])
    with pytest.raises(InvalidRequestError, match=message):
        datum_rows(wire, LOSSES["cross_entropy"], vocabulary=VOCABULARY, context=CONTEXT)


@pytest.mark.parametrize("name", ["advantages", "logprobs"])
def test_a_policy_loss_refuses_non_finite_advantages_and_logprobs(name: str):
    values = {"advantages": [1.0, 1.0, 1.0], "logprobs": [-1.0, -1.0, -1.0]}
    values[name] = [0.0, -math.inf, 0.0]
    wire = request([datum([1, 2, 3, 4], **values)], loss_fn="importance_sampling")
    with pytest.raises(InvalidRequestError, match=rf"loss_fn_inputs\['{name}'\] holds -inf"):
        datum_rows(wire, LOSSES["importance_sampling"], vocabulary=VOCABULARY, context=CONTEXT)


def test_token_ids_outside_the_vocabulary_or_past_the_context_are_refused():
    with pytest.raises(InvalidRequestError, match=r"model_input holds token ids \[128\]"):
        rows_of([[1, 128, 3]])
    with pytest.raises(InvalidRequestError, match="the model's context is 256"):
        rows_of([[1] * 258])


@pytest.fixture(scope="module")
def trainers(tmp_path_factory: pytest.TempPathFactory):
    """Two trainers from the same seed on one engine, one packing and one not."""
    packed, padded = twin_trainers(tmp_path_factory.mktemp("datum-packing"), seed=3)
    for trainer in (packed, padded):  # a trained-looking adapter, so the LoRA shapes the scores
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(0)
            for param in trainer.params:
                param.normal_(std=0.2)
    return packed, padded


@pytest.mark.parametrize("budget", [1000, 16])  # 16: the first prompt's samples split in two
def test_packed_scores_and_gradients_equal_the_padded_forwards(trainers, budget: int):
    """The cookbook's datums through `forward_backward`: every datum's logprobs, its
    elementwise loss and the accumulated gradient are the padded forward's, and so is the
    optimizer step after."""
    from art_backend.testing import OptimizerSettings

    packed, padded = trainers
    sequences = cookbook_sequences()
    data = [
        datum(s, weights=(np.linspace(-1.0, 1.0, len(s) - 1) * (i + 1)).tolist())
        for i, s in enumerate(sequences)
    ]
    rows = datum_rows(
        request(data), LOSSES["cross_entropy"], vocabulary=VOCABULARY, context=CONTEXT
    )
    settings = OptimizerSettings(learning_rate=1e-2, micro_batch_tokens=budget)
    scored = {}
    for trainer in (packed, padded):
        loss = DatumLoss(LOSSES["cross_entropy"], {})
        trainer.forward_backward(rows, loss, settings, share_trained=True)
        scored[trainer.adapter_name] = loss
    for number, sequence in enumerate(sequences):
        for kind in ("logprobs", "losses"):
            a = getattr(scored["packed"], kind)[number]
            b = getattr(scored["padded"], kind)[number]
            assert a.shape == (len(sequence) - 1,) and torch.allclose(a, b, atol=1e-5)
        assert float(scored["packed"].logprobs[number].abs().sum()) > 0
    for a, b in zip(packed.params, padded.params, strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4)
    norms = [trainer.optim_step(settings) for trainer in (packed, padded)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-4) and norms[0] > 0
    for a, b in zip(packed.params, padded.params, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_call_whose_loss_is_not_finite_adds_none_of_its_gradient(trainers):
    """forward_backward adds all of a call's gradient or none: a finite call's gradient stays
    exactly what it was after a call whose second micro-batch's loss overflows."""
    from art_backend.testing import OptimizerSettings

    trainer, _ = trainers
    settings = OptimizerSettings(micro_batch_tokens=8)  # one datum per micro-batch
    good = datum_rows(
        request([datum([1, 2, 3, 4])]),
        LOSSES["cross_entropy"],
        vocabulary=VOCABULARY,
        context=CONTEXT,
    )
    trainer.forward_backward(good, DatumLoss(LOSSES["cross_entropy"], {}), settings)
    before = [param.grad.clone() for param in trainer.params]
    huge = [float(np.finfo(np.float32).max)] * 3
    data = [datum([1, 2, 3, 4], weights=[1.0, 1.0, 1.0]), datum([5, 6, 7, 8], weights=huge)]
    bad = datum_rows(request(data), LOSSES["cross_entropy"], vocabulary=VOCABULARY, context=CONTEXT)
    with pytest.raises(FloatingPointError, match="not finite"):
        trainer.forward_backward(bad, DatumLoss(LOSSES["cross_entropy"], {}), settings)
    assert all(torch.equal(p.grad, b) for p, b in zip(trainer.params, before, strict=True))
    assert math.isfinite(trainer.optim_step(settings))
