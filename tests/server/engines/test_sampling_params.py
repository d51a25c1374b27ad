"""`SamplingParams` checks itself where it is built: the net under every route's sampling fields.

A value outside the bounds is an `InvalidRequestError` naming the field, whichever protocol
brought it (the OpenAI routes' schemas check first; the Tinker API's reached the engine
unchecked: a 2**70 seed failed on the engine thread, 20,000 stop strings held every chat).
"""

from __future__ import annotations

import math

import pytest

from art_backend._errors import InvalidRequestError
from art_backend.engines._engine import MAX_STOP_CHARACTERS, SamplingParams
from art_core.wire import SEED_RANGE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1), ("temperature", 2.5), ("temperature", math.inf),
        ("temperature", math.nan), ("top_p", 0.0), ("top_p", 1.01), ("top_p", math.nan),
        ("top_k", -1), ("min_p", 1.5), ("min_p", -0.1), ("max_new_tokens", 0),
        ("repetition_penalty", 0.0), ("repetition_penalty", math.inf),
        ("presence_penalty", 3.0), ("frequency_penalty", -math.inf), ("top_logprobs", -1),
        ("seed", SEED_RANGE[1] + 1), ("seed", SEED_RANGE[0] - 1), ("seed", 2**70),
        ("stop", ["x" * 100] * 200), ("logit_bias", {5: math.inf}), ("logit_bias", {5: 101.0}),
    ],
)  # fmt: skip
def test_a_value_out_of_bounds_is_refused_naming_its_field(field: str, value: object):
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(**{"max_new_tokens": 4, field: value})
    assert refused.value.param == field
    assert field in refused.value.message or field == "stop"


def test_the_stop_strings_are_bounded_in_all_by_the_one_constant():
    SamplingParams(max_new_tokens=4, stop=["x" * (MAX_STOP_CHARACTERS - 1), "y"])
    with pytest.raises(InvalidRequestError, match="16,385 characters in all"):
        SamplingParams(max_new_tokens=4, stop=["x" * MAX_STOP_CHARACTERS, "y"])


@pytest.mark.parametrize(
    "settings",
    [
        {}, {"temperature": 0.0}, {"temperature": 2.0}, {"temperature": 1e-320}, {"top_p": 1e-9},
        {"top_k": 0}, {"top_k": 10**9}, {"min_p": 1.0}, {"seed": SEED_RANGE[0]},
        {"seed": SEED_RANGE[1]}, {"repetition_penalty": 2.0}, {"logit_bias": {0: -100.0}},
    ],
)  # fmt: skip
def test_the_bounds_themselves_and_every_off_value_are_served(settings: dict):
    assert SamplingParams(max_new_tokens=1, **settings).max_new_tokens == 1


def test_a_rebuilt_copy_is_checked_too():
    import dataclasses

    with pytest.raises(InvalidRequestError, match="temperature"):
        dataclasses.replace(SamplingParams(max_new_tokens=1), temperature=3.0)
