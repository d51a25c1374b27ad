"""A choice's text as its tokens arrive: incremental detokenization and stop strings.

The engine decodes a short window of tokens per step rather than the whole choice, and holds back
the end of the text while it may be the start of a stop string, so a streamed delta never has to
be taken back.
"""

from __future__ import annotations

import functools
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


class StopMatcher:
    """One choice's stop strings, matched as its text grows, in time independent of their number
    and length: an Aho-Corasick automaton over the stop strings, fed each new character once.

    `feed(text)` reads what `text` (the whole text so far; it only grows) adds and returns where
    the earliest stop string completed in it starts, or None; `held_back` is how many characters
    at the end may still begin a stop string (not sent yet). Checking every stop at every token
    instead cost 19.8 s for 2,000 tokens with 4 stops of 10,000 characters (issue 43). The
    automaton is built once per set of stops (a request's choices share it); a matcher is its
    position in it.
    """

    def __init__(self, stops: list[str]) -> None:
        self._next, self._depth, self._longest, self._fail = _automaton(tuple(stops))
        self._node = 0
        self._read = 0

    def feed(self, text: str) -> int | None:
        """Read `text[what was read:]`; where the earliest stop completed in it starts, or None."""
        earliest = None
        for position in range(self._read, len(text)):
            character, node = text[position], self._node
            while node and character not in self._next[node]:
                node = self._fail[node]
            node = self._next[node].get(character, 0)
            self._node = node
            if self._longest[node]:
                start = position + 1 - self._longest[node]
                earliest = start if earliest is None else min(earliest, start)
        self._read = len(text)
        return earliest

    @property
    def held_back(self) -> int:
        """How many characters at the end of what was read may begin a stop string."""
        return self._depth[self._node]


Automaton = tuple[list[dict[str, int]], list[int], list[int], list[int]]


# A few sets at once: a request's choices (and a client's repeated stops) share one; at most
# 16,384 characters of stops each (serving/_request.py), so the cache stays small.
@functools.lru_cache(maxsize=8)
def _automaton(stops: tuple[str, ...]) -> Automaton:
    """The stops' trie (node -> character -> node), each node's depth, the longest stop ending
    at it (its suffixes included) and its failure link (the node of its longest proper suffix)."""
    following: list[dict[str, int]] = [{}]
    depth, longest = [0], [0]
    for stop in filter(None, stops):
        node = 0
        for character in stop:
            if character not in following[node]:
                following[node][character] = len(following)
                following.append({})
                depth.append(depth[node] + 1)
                longest.append(0)
            node = following[node][character]
        longest[node] = len(stop)
    fail = [0] * len(following)
    queue = list(following[0].values())
    for node in queue:  # breadth first: a node's suffix is linked before the node
        for character, child in following[node].items():
            queue.append(child)
            link = fail[node]
            while link and character not in following[link]:
                link = fail[link]
            target = following[link].get(character, 0)
            fail[child] = target if target != child else 0
            longest[child] = max(longest[child], longest[fail[child]])
    return following, depth, longest, fail
