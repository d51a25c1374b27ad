"""`OptimizerSettings` checks itself where it is built, whichever route built it (a train step's
config, the Tinker API's optim_step, a replayed step's record): an infinite learning rate, eps or
weight decay turned every weight NaN at the first step, and every logprob after it."""

from __future__ import annotations

import math

import pytest

from art_backend._errors import InvalidRequestError
from art_backend.training._optimizer import OptimizerSettings


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("learning_rate", math.inf, "learning_rate"), ("learning_rate", math.nan, "learning_rate"),
        ("learning_rate", -1e-5, "learning_rate"), ("weight_decay", math.inf, "weight_decay"),
        ("weight_decay", -0.1, "weight_decay"), ("eps", math.inf, "eps"), ("eps", 0.0, "eps"),
        ("eps", math.nan, "eps"), ("max_grad_norm", 0.0, "max_grad_norm"),
        ("max_grad_norm", math.nan, "max_grad_norm"), ("betas", (1.0, 0.99), "betas"),
        ("betas", (0.9, math.nan), "betas"), ("betas", (-0.1, 0.9), "betas"),
        ("micro_batch_tokens", 0, "micro_batch_tokens"),
    ],
)  # fmt: skip
def test_a_value_out_of_bounds_is_refused_naming_its_field(field: str, value: object, param: str):
    with pytest.raises(InvalidRequestError) as refused:
        OptimizerSettings(**{field: value})
    assert refused.value.param == param
    assert param in refused.value.message


def test_an_infinite_gradient_norm_bound_means_no_clipping_and_is_served():
    settings = OptimizerSettings(
        learning_rate=0.0, max_grad_norm=math.inf, betas=(0.0, 0.0), eps=1e-12, weight_decay=0.0
    )
    assert settings.max_grad_norm == math.inf


def test_a_train_configs_settings_are_checked_as_they_are_built():
    class Config:  # a TrainConfig whose learning rate was set after validation
        learning_rate, max_grad_norm, weight_decay = math.inf, 1.0, 0.0
        micro_batch_tokens, gradient_checkpointing = 2048, False

    with pytest.raises(InvalidRequestError, match="learning_rate is inf"):
        OptimizerSettings.from_config(Config())
