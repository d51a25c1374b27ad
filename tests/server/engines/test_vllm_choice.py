"""Stop strings the vLLM engine matches on our side (`engines/_vllm_choice.py`), fed chunks as
vLLM streams them; no vLLM needed. The end-to-end parity with the torch engine is in
test_vllm_engine.py (make test-vllm)."""

from __future__ import annotations

import pytest

from art_backend.engines._vllm_choice import (
    VLLM_STOP_CHARACTERS,
    VLLM_STOPS,
    Chunk,
    VllmChoice,
    matched_by_vllm,
)
from tests.support.tiny_model import tiny_tokenizer

TEXT = "hello world, stop here please"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def chunks(tokenizer, per_chunk: int) -> list[Chunk]:
    """TEXT as vLLM streams it: `per_chunk` tokens a chunk, each with the text they add."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    result, decoded = [], ""
    for start in range(0, len(ids), per_chunk):
        piece = ids[start : start + per_chunk]
        text = tokenizer.decode(ids[: start + len(piece)])
        result.append(Chunk(piece, [-0.5] * len(piece), [None] * len(piece), text[len(decoded) :]))
        decoded = text
    return result


def run(choice: VllmChoice, stream: list[Chunk], tokenizer) -> tuple[list[int], str, bool]:
    """Feed `stream` as the engine does; the kept tokens, the streamed text, and if a stop hit."""
    streamed = ""
    for chunk in stream:
        kept, stopped = choice.add(chunk, tokenizer)
        choice.token_ids += kept.token_ids
        streamed += choice.stream_delta(final=stopped)
        if stopped:
            return choice.token_ids, streamed, True
    return choice.token_ids, streamed + choice.stream_delta(final=True), False


def expected_tokens(tokenizer, stop: str) -> list[int]:
    """The tokens up to the one whose text completes `stop` (the torch engine's answer)."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    end = next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:n]))
    return ids[:end]


def test_few_short_stops_go_to_vllm_and_many_or_long_ones_are_ours():
    assert matched_by_vllm(["\n\n", "User:"])
    assert not matched_by_vllm([f"stop{n}" for n in range(VLLM_STOPS + 1)])
    assert not matched_by_vllm(["x" * (VLLM_STOP_CHARACTERS + 1)])


@pytest.mark.parametrize("per_chunk", [1, 3, 100])  # 100: vLLM sent every token in one chunk
def test_a_choice_ends_at_the_token_that_completes_the_earliest_stop(tokenizer, per_chunk):
    decoys = [f"never-{n}-" * 3 for n in range(50)]
    choice = VllmChoice([*decoys, "stop", "world"])
    tokens, streamed, stopped = run(choice, chunks(tokenizer, per_chunk), tokenizer)
    assert stopped
    assert choice.text == streamed == "hello "  # cut where "world" begins, never sent
    assert tokens == expected_tokens(tokenizer, "world")


def test_text_that_may_begin_a_stop_is_held_back_until_it_cannot(tokenizer):
    choice = VllmChoice(["world peace"])  # "world" matches its beginning, then differs
    sent = []
    for chunk in chunks(tokenizer, 1):
        kept, stopped = choice.add(chunk, tokenizer)
        choice.token_ids += kept.token_ids
        sent.append(choice.stream_delta(final=False))
        assert not stopped
        assert "hello world"[: len(choice.emitted)] == choice.emitted[:11]
    assert "".join(sent) + choice.stream_delta(final=True) == TEXT
    assert "w" not in "".join(sent[:8])  # "w", "o", "r", "l", "d" waited for the ","


def test_without_our_stops_everything_is_kept_and_sent(tokenizer):
    choice = VllmChoice(None)
    tokens, streamed, stopped = run(choice, chunks(tokenizer, 2), tokenizer)
    assert not stopped and streamed == TEXT
    assert tokens == tokenizer.encode(TEXT, add_special_tokens=False)
