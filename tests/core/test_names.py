"""The one name rule (art_core/names.py): what each kind of name accepts, and its edges."""

from __future__ import annotations

import pytest

from art_core.names import is_adapter_name, is_name, is_rollout_id, is_served_name, is_split


@pytest.mark.parametrize(
    ("check", "good"),
    [
        (is_name, "agent-1.v2"),
        (is_split, "val_2"),
        (is_rollout_id, "r1:turn-2"),
        (is_served_name, "org/model-1"),
        (is_adapter_name, "agent@12"),
    ],
)
def test_each_rule_takes_its_names_and_no_trailing_newline(check, good: str):
    """`$` also matches before a final newline: `agent\\n` once passed (and reached a path)."""
    assert check(good)
    assert not check(good + "\n")
    assert not check("\n" + good)
    assert not check(good + "\x00")


def test_names_refuse_climbing_and_odd_starts():
    assert not is_name("..")
    assert not is_name("a..b")
    assert not is_name(".hidden")
    assert not is_name("x" * 101)
    assert not is_served_name("a@1")
    assert not is_adapter_name("agent@1234567890")
