"""What judge and generator calls cost (`JudgeUsage`): requests, tokens, dollars, cache hits."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class JudgeUsage:
    """What judge or generator calls cost: requests, tokens, dollars (when priced), cache hits.

    `truncated_*` count the messages RULER shortened to fit its per-message budget.
    """

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cache_hits: int = 0
    reasks: int = 0
    truncated_messages: int = 0
    truncated_chars: int = 0

    def add(self, other: JudgeUsage) -> None:
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def summary(self) -> str:
        """One line for people: requests, tokens, cache hits, and cost when priced."""
        line = (
            f"{self.requests} requests, {self.prompt_tokens} prompt + {self.completion_tokens} "
            f"completion tokens, {self.cache_hits} cache hits"
        )
        return line + (f", ${self.cost_usd:.4f}" if self.cost_usd else "")

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        """As step metrics (summed over groups by the backend)."""
        return {f"{prefix}{field.name}": float(getattr(self, field.name)) for field in fields(self)}
