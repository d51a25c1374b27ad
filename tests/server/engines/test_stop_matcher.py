"""Stop strings matched as a choice's text grows (`StopMatcher`): the same answers as checking
every stop string against the whole text at every token, in time that does not grow with them."""

from __future__ import annotations

import random

import pytest

from art_backend.engines._text import StopMatcher


def earliest_stop(text: str, stops: list[str]) -> int | None:
    """The reference: where the first stop string in the whole text starts."""
    positions = [text.find(stop) for stop in stops if stop and stop in text]
    return min(positions) if positions else None


def longest_stop_prefix(text: str, stops: list[str]) -> int:
    """The reference: the longest end of `text` that begins some stop string."""
    return max(
        (size for stop in stops for size in range(1, len(stop)) if text.endswith(stop[:size])),
        default=0,
    )


@pytest.mark.parametrize("seed", range(200))
def test_fed_in_chunks_it_answers_as_checking_the_whole_text_each_time(seed: int):
    rng = random.Random(seed)
    alphabet = "ab" if seed % 2 else "abc "
    stops = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        for _ in range(rng.randint(1, 5))
    ]
    matcher, text = StopMatcher(stops), ""
    while len(text) < 40:
        text += "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        found = matcher.feed(text)
        assert found == earliest_stop(text, stops), (stops, text)
        if found is not None:
            break  # the engine ends the choice here
        assert matcher.held_back == longest_stop_prefix(text, stops), (stops, text)


def test_the_earliest_start_wins_when_two_stops_end_in_one_chunk():
    matcher = StopMatcher(["abcdef", "cd"])
    assert matcher.feed("xxabcdef") == 2  # "abcdef" starts before "cd", both complete here
    matcher = StopMatcher(["abcdef", "cd"])
    assert matcher.feed("xxabcd") == 4  # "cd" completes first: the choice ends there


def test_no_stops_hold_nothing_back_and_never_match():
    matcher = StopMatcher([])
    assert matcher.feed("anything at all") is None and matcher.held_back == 0
    assert StopMatcher(["", ""]).feed("text") is None


def test_long_stops_share_one_trie_and_a_long_run_that_may_begin_one_is_held_back():
    stops = ["x" * 9_999 + str(i) for i in range(4)]
    matcher = StopMatcher(stops)
    text = ""
    for _ in range(2_000):
        text += "xxxxx"
        assert matcher.feed(text) is None
    assert matcher.held_back == 9_999  # may still begin a stop: held back
    assert len(matcher._next) == 9_999 + 4 + 1  # the common prefix is stored once
    assert matcher.feed(text + "1") == len(text) - 9_999
