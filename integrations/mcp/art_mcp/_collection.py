"""ART's `GeneratedScenarioCollection`: what `generate_scenarios(tools=...)` returns.

It holds `art.Scenario`s (ART's `GeneratedScenario` is ours: `task`, `difficulty`, and an
optional `expected`) in `.scenarios`, and is a sequence of them, so `for s in collection`,
`collection[0]`, `len(collection)` and `art.split_scenarios(collection)` /
`art.save_scenarios(path, collection)` work as on a list. ART's helpers (`split`, `shuffle`,
`filter_by_difficulty`, `preview`, ...) keep ART's meaning.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import art_core as art

PREVIEW_CHARS = 120  # ART's preview cut


class GeneratedScenarioCollection(Sequence[art.Scenario]):
    """Generated scenarios, in order, with ART's helpers."""

    def __init__(self, scenarios: Iterable[art.Scenario]) -> None:
        self.scenarios: list[art.Scenario] = list(scenarios)

    @classmethod
    def from_dicts(cls, data: Iterable[Mapping[str, Any]]) -> GeneratedScenarioCollection:
        """Scenarios from dicts with `task` and `difficulty` (and optionally `expected`)."""
        return cls(art.Scenario.model_validate(item) for item in data)

    @classmethod
    def from_json(cls, text: str) -> GeneratedScenarioCollection:
        """From `to_json()`'s `{"scenarios": [...]}`, or a bare list of scenario objects."""
        data = json.loads(text)
        return cls.from_dicts(data["scenarios"] if isinstance(data, dict) else data)

    def to_dicts(self) -> list[dict[str, Any]]:
        """Each scenario as a dict (`expected` only where there is one)."""
        return [scenario.model_dump(exclude_none=True) for scenario in self.scenarios]

    def to_json(self, indent: int | None = None) -> str:
        """`{"scenarios": [...]}`, as ART writes it."""
        return json.dumps({"scenarios": self.to_dicts()}, indent=indent, ensure_ascii=False)

    def __len__(self) -> int:
        return len(self.scenarios)

    @overload
    def __getitem__(self, index: int) -> art.Scenario: ...
    @overload
    def __getitem__(self, index: slice) -> list[art.Scenario]: ...
    def __getitem__(self, index: int | slice) -> art.Scenario | list[art.Scenario]:
        return self.scenarios[index]

    def __iter__(self) -> Iterator[art.Scenario]:
        return iter(self.scenarios)

    def __repr__(self) -> str:
        return f"GeneratedScenarioCollection({len(self.scenarios)} scenarios)"

    def shuffle(self, seed: int | None = None) -> GeneratedScenarioCollection:
        """A new collection in random order (`seed` for a repeatable one)."""
        shuffled = list(self.scenarios)
        random.Random(seed).shuffle(shuffled)
        return GeneratedScenarioCollection(shuffled)

    def split(
        self, train_size: int
    ) -> tuple[GeneratedScenarioCollection, GeneratedScenarioCollection]:
        """(the first `train_size` scenarios, the rest), in order, as ART splits."""
        if not 0 <= train_size <= len(self.scenarios):
            raise ValueError(
                f"train_size must be between 0 and the {len(self.scenarios)} scenarios, "
                f"got {train_size}"
            )
        return (
            GeneratedScenarioCollection(self.scenarios[:train_size]),
            GeneratedScenarioCollection(self.scenarios[train_size:]),
        )

    def filter_by_difficulty(
        self, min_difficulty: int = 1, max_difficulty: int = 5
    ) -> GeneratedScenarioCollection:
        """The scenarios whose difficulty is within [min_difficulty, max_difficulty]."""
        return GeneratedScenarioCollection(
            s for s in self.scenarios if min_difficulty <= s.difficulty <= max_difficulty
        )

    def get_difficulty_distribution(self) -> Counter[int]:
        """How many scenarios there are of each difficulty."""
        return Counter(scenario.difficulty for scenario in self.scenarios)

    def get_summary(self) -> dict[str, Any]:
        """Count, difficulty distribution, mean difficulty and mean task length."""
        count = len(self.scenarios)
        return {
            "total_scenarios": count,
            "difficulty_distribution": dict(self.get_difficulty_distribution()),
            "avg_difficulty": sum(s.difficulty for s in self.scenarios) / count if count else 0,
            "avg_task_length": sum(len(s.task) for s in self.scenarios) / count if count else 0,
        }

    def preview(self, n: int = 5, max_task_length: int = PREVIEW_CHARS) -> None:
        """Print the first `n` tasks (cut at `max_task_length`) with their difficulty."""
        print_preview(self.scenarios, n, max_task_length)

    def print_difficulty_distribution(self) -> None:
        """Print one bar per difficulty level."""
        counts = self.get_difficulty_distribution()
        top = _top_level(self.scenarios)
        print("Difficulty distribution:")
        for level in range(1, top + 1):
            print(f"   {level}/{top}: {counts.get(level, 0):3d}  {'█' * min(counts[level], 30)}")


def print_preview(
    scenarios: Sequence[art.Scenario], n: int = 5, max_task_length: int = PREVIEW_CHARS
) -> None:
    """Print the first `n` scenarios' tasks, numbered, with `(difficulty d/5)` as ART does."""
    top = _top_level(scenarios)
    for number, scenario in enumerate(scenarios[:n], 1):
        task = scenario.task.strip()
        if len(task) > max_task_length:
            task = task[:max_task_length].rstrip() + "…"
        print(f"   {number}. {task}  (difficulty {scenario.difficulty}/{top})")


def _top_level(scenarios: Iterable[art.Scenario]) -> int:
    """ART's scale is 1-5; ours goes to 10 where a caller asked for harder scenarios."""
    return max([5, *(scenario.difficulty for scenario in scenarios)])
