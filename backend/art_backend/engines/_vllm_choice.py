"""One choice of a vLLM request as its chunks arrive, and the stop strings matched on our side.

vLLM checks every stop string at every token (a `find` per stop over the new text), so its cost
grows with the number and length of the stops: few and short, it is what any vLLM user pays;
many or long (the API allows 256 stops, 16,384 characters), it is a client's way to slow every
other request. Those are matched here instead, with the automaton the torch engine uses
(`_text.StopMatcher`: time independent of their number), on the streamed text: the choice ends
at the token that completed a stop, its text is cut where the stop begins, the characters that
may begin a stop are held back from the stream, and the tokens vLLM sampled after are dropped
(the request's stream is closed once every choice has ended, which aborts it in vLLM). Both
ways give the torch engine's answer: the same tokens, text and finish reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from art_backend.engines._engine import FinishEvent
from art_backend.engines._text import StopMatcher

# Stops vLLM matches itself: at most this many, of at most this many characters in all.
VLLM_STOPS = 4
VLLM_STOP_CHARACTERS = 256


def matched_by_vllm(stops: list[str]) -> bool:
    """Whether vLLM gets these stop strings (few and short) or we match them."""
    return len(stops) <= VLLM_STOPS and sum(len(stop) for stop in stops) <= VLLM_STOP_CHARACTERS


@dataclass
class Chunk:
    """What one streamed chunk adds to a choice: tokens, their logprobs and top lists, text."""

    token_ids: list[int]
    logprobs: list[float]
    tops: list[Any]
    text: str


@dataclass
class VllmChoice:
    """What one choice has produced so far; `stops` when we match its stop strings."""

    stop_strings: list[str] | None = None
    text: str = ""
    emitted: str = ""  # the text already sent in token events
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    stops: StopMatcher | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.stop_strings:
            self.stops = StopMatcher(self.stop_strings)

    def add(self, chunk: Chunk, tokenizer: Any) -> tuple[Chunk, bool]:
        """Append `chunk`'s text; the part of its tokens this choice keeps, and whether one of
        our stops ended the choice in it (then the text is cut where that stop begins, and the
        tokens end at the one that completed it)."""
        whole = self.text + chunk.text
        start = self.stops.feed(whole) if self.stops is not None else None
        if start is None:
            self.text = whole
            return chunk, False
        kept = _completing_token(self.token_ids, chunk.token_ids, self.stop_strings, tokenizer)
        self.text = whole[:start]
        return Chunk(chunk.token_ids[:kept], chunk.logprobs[:kept], chunk.tops[:kept], ""), True

    def stream_delta(self, *, final: bool) -> str:
        """The text not sent yet, less what may begin a stop string (all of it when `final`)."""
        end = len(self.text)
        if not final and self.stops is not None:
            end -= min(self.stops.held_back, end)
        delta = self.text[len(self.emitted) : end] if end > len(self.emitted) else ""
        self.emitted += delta
        return delta

    def finish_event(self, index: int) -> FinishEvent:
        assert self.finish_reason is not None
        return FinishEvent(
            choice_index=index,
            finish_reason=self.finish_reason,
            text=self.text,
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            top_logprobs=self.top_logprobs,
            error=self.error,
        )


def _completing_token(
    before: list[int], new: list[int], stops: list[str] | None, tokenizer: Any
) -> int:
    """How many of a chunk's `new` tokens it takes for the decoded text to hold a stop (vLLM
    may send several tokens in one chunk under load); all of them when decoding cannot say."""
    if len(new) <= 1 or not stops:
        return len(new)
    for count in range(1, len(new)):
        decoded = tokenizer.decode(before + new[:count], skip_special_tokens=True)
        if StopMatcher(stops).feed(decoded) is not None:  # the same automaton, cached
            return count
    return len(new)
