"""The state of one choice inside the torch engine's running batch: its tokens, logprobs, text
(decoded incrementally, stop strings matched as it grows) and its row's length in the cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from art_backend.engines._engine import GenerationRequest
from art_backend.engines._text import StopMatcher


@dataclass
class RunningChoice:
    """The state of one choice inside the running batch."""

    request: GenerationRequest
    choice_index: int
    generator: torch.Generator | None  # a seeded choice's own; None draws with the batch
    constraint: Any = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    token_counts: dict[int, int] = field(default_factory=dict)
    text: str = ""  # decoded so far
    emitted_text: str = ""  # sent to the client so far (stop-string prefixes held back)
    prefix_offset: int = 0  # incremental detokenization window
    read_offset: int = 0
    length: int = 0  # real tokens in the cache for this row (prompt + sampled, before next)
    finished: bool = False
    stops: StopMatcher = field(init=False)  # the request's stop strings, matched as text grows
    # The prompt's distinct ids, once, for the repetition penalty (empty when it is off).
    prompt_id_set: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        params = self.request.params
        self.stops = StopMatcher(params.stop)
        penalised = params.repetition_penalty != 1.0
        self.prompt_id_set = frozenset(self.request.prompt_ids if penalised else ())
