"""A choice's text as its tokens arrive: incremental detokenization and stop strings.

The engine decodes a short window of tokens per step rather than the whole choice, and holds back
the end of the text while it may be the start of a stop string, so a streamed delta never has to
be taken back.
"""

from __future__ import annotations

from typing import Any, Protocol


class DecodingState(Protocol):
    """What `decode_increment` reads and moves: a choice's tokens and its decode window."""

    token_ids: list[int]
    prefix_offset: int
    read_offset: int


def decode_increment(tokenizer: Any, state: DecodingState, *, final: bool) -> str:
    """New text from the last token, decoding a short window, not the whole sequence.

    The window starts a few tokens back so tokenizers that drop a leading space decode right; an
    unfinished UTF-8 character (U+FFFD) waits for the next token unless `final`.
    """
    ids = state.token_ids
    before = tokenizer.decode(
        ids[state.prefix_offset : state.read_offset], skip_special_tokens=True
    )
    after = tokenizer.decode(ids[state.prefix_offset :], skip_special_tokens=True)
    if len(after) > len(before) and (final or not after.endswith("\ufffd")):
        state.prefix_offset, state.read_offset = state.read_offset, len(ids)
        return after[len(before) :]
    return ""


def find_stop(text: str, stops: list[str]) -> int | None:
    """Where the first stop string in `text` starts, or None."""
    positions = [text.find(stop) for stop in stops if stop and stop in text]
    return min(positions) if positions else None


def stop_prefix_length(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` may begin a stop string (held back)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                longest = max(longest, size)
                break
    return longest
