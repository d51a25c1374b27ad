"""Behaviour diff between two steps: the held-out answers of step N and step M, side by side.

The comparison is pure (rows in, a `StepDiff` out); `load_step_diff` at the bottom reads the
rows from the store (`trajectories/<split>/<step>.jsonl.gz`, what `model.log(groups,
split="val")` wrote at each step). Used by the review page (`/review/<project>/<name>/diff`)
and by `art diff`.

Matching. Each trajectory is an example with a key, the first of:

    metadata["scenario_id"]   the caller's own id for the scenario
    metadata["scenario"]      what art_core's generators and integrations set
    the prompt                the messages before the first assistant turn (role and text)

An example of step N is paired with the example of step M that has the same key; when a key
holds several trajectories at a step (a group of samples per scenario), the k-th of step N is
paired with the k-th of step M. What is left over on either side is counted, not compared.

Tags (several can apply to one pair; `TAGS` is the table):

    newly_right     wrong at N, right at M   right: `CorrectnessRule` (default reward > 0)
    newly_wrong     right at N, wrong at M
    format_changed  the answer's shape differs: tool call, JSON, code, markdown, prose, empty
    length_changed  the longer answer is more than (1 + margin) times the shorter one and at
                    least `min_length_change` characters longer (default margin 0.5, 20 chars)
    tools_changed   the sequence of tool names called differs
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from art_backend._errors import (
    InvalidRequestError,
    StepsNotComparableError,
    StoreFileDamagedError,
    StoreNotFoundError,
)
from art_backend.review._browse import log_again, message_text, read_step_file
from art_backend.store._checkpoints import ModelStore

# tag -> what it means, as shown on the page and by `art diff`
TAGS = {
    "newly_right": "newly right",
    "newly_wrong": "newly wrong",
    "format_changed": "format changed",
    "length_changed": "length changed",
    "tools_changed": "tool-call pattern changed",
}
TAG_FILTERS = (*TAGS, "changed", "unchanged")  # what `tag=` may name ('' for all)
KEY_FIELDS = ("scenario_id", "scenario")  # metadata keys tried in order, then the prompt


# ------------------------------------------------------------------------------------ rules


@dataclass(frozen=True)
class CorrectnessRule:
    """An answer is right when `metric` (default: the reward) is above `threshold`."""

    metric: str | None = None
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.threshold):
            raise InvalidRequestError(
                f"The threshold must be a finite number, got {self.threshold!r}.",
                param="threshold",
            )

    def describe(self) -> str:
        return f"{self.metric or 'reward'} > {self.threshold:g}"

    def is_right(self, row: dict[str, Any]) -> bool | None:
        """Right, wrong, or None when the row lacks the metric (then neither tag applies)."""
        if self.metric is None:
            value = row.get("reward")
        else:
            value = (row.get("metrics") or {}).get(self.metric)
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return None
        return value > self.threshold


@dataclass(frozen=True)
class DiffOptions:
    """How answers are judged and compared; every field has a default."""

    rule: CorrectnessRule = field(default_factory=CorrectnessRule)
    length_margin: float = 0.5  # relative: 0.5 means the longer is over 1.5x the shorter
    min_length_change: int = 20  # characters: a 3 -> 6 character answer is not a change

    def __post_init__(self) -> None:
        if not (math.isfinite(self.length_margin) and self.length_margin >= 0):
            raise InvalidRequestError(
                f"The length margin must be a number >= 0, got {self.length_margin!r}.",
                param="length_margin",
            )


# ---------------------------------------------------------------------------------- answers


@dataclass
class Answer:
    """One trajectory's answer to an example: what came after the prompt, and its features."""

    trajectory_id: str
    reward: float | None
    right: bool | None
    messages: list[dict[str, Any]]  # from the first assistant turn on
    text: str  # the assistant turns' text
    format: str
    tools: list[str]
    metrics: dict[str, Any]

    @property
    def length(self) -> int:
        return len(self.text)

    def to_json(self) -> dict[str, Any]:
        return _attributes(self, "trajectory_id reward right format length tools text metrics")


def _attributes(value: Any, names: str) -> dict[str, Any]:
    """The attributes `names` (space-separated) of `value`, in that order: a JSON object."""
    return {name: getattr(value, name) for name in names.split()}


def conversation_of(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of a row's first history (the conversation the example is about)."""
    histories = row.get("histories") or []
    first = histories[0] if histories and isinstance(histories[0], dict) else {}
    return [m for m in first.get("messages") or [] if isinstance(m, dict)]


def split_prompt(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the prompt: messages before the first assistant turn, the answer: the rest)."""
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            return messages[:index], messages[index:]
    return messages, []


def example_key(row: dict[str, Any]) -> tuple[str, str]:
    """(how the example is keyed, the key): a scenario id in the metadata, else the prompt."""
    metadata = row.get("metadata") or {}
    for name in KEY_FIELDS:
        value = metadata.get(name) if isinstance(metadata, dict) else None
        if value is not None and value != "":
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            return name, text
    prompt, _ = split_prompt(conversation_of(row))
    return "prompt", "\n".join(f"{m.get('role')}: {message_text(m)}" for m in prompt)


def answer_format(messages: list[dict[str, Any]]) -> str:
    """The shape of an answer, by its last assistant turn: tool call, JSON, code, markdown,
    prose or empty."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    if last is None:
        return "empty"
    text = message_text({"content": last.get("content")}).strip()
    if not text:
        return "tool call" if last.get("tool_calls") else "empty"
    if text[:1] in "{[":
        try:
            json.loads(text)
            return "JSON"
        except ValueError:
            pass
    if "```" in text:
        return "code"
    if MARKDOWN.search(text):
        return "markdown"
    return "prose"


# Headings, list items, tables, bold: what makes a reply markdown rather than prose.
MARKDOWN = re.compile(r"(?m)^(#{1,6} |\s*[-*+] |\s*\d+[.)] |\|.*\|\s*$)|\*\*[^*\n]+\*\*")


def tool_names(messages: list[dict[str, Any]]) -> list[str]:
    """The tools an answer called, in order."""
    names = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            names.append(str(function.get("name", "?")))
    return names


def answer_of(row: dict[str, Any], rule: CorrectnessRule) -> Answer:
    _, messages = split_prompt(conversation_of(row))
    reward = row.get("reward")
    return Answer(
        trajectory_id=str(row.get("id", "")),
        reward=float(reward) if isinstance(reward, int | float) else None,
        right=rule.is_right(row),
        messages=messages,
        text="\n".join(
            message_text({"content": m.get("content")})
            for m in messages
            if m.get("role") == "assistant" and m.get("content")
        ),
        format=answer_format(messages),
        tools=tool_names(messages),
        metrics=dict(row.get("metrics") or {}),
    )


# -------------------------------------------------------------------------------- the diff


@dataclass
class ExampleDiff:
    """One example at both steps, with what changed."""

    key_kind: str  # scenario_id, scenario or prompt
    key: str
    sample: int  # which sample of the key (0 unless a step holds several per key)
    prompt: list[dict[str, Any]]
    before: Answer
    after: Answer
    tags: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            **_attributes(self, "key_kind key sample prompt tags"),
            "before": self.before.to_json(),
            "after": self.after.to_json(),
        }


@dataclass
class StepDiff:
    """Every example two steps have in common, tagged, with counts."""

    split: str
    from_step: int
    to_step: int
    options: DiffOptions
    examples: list[ExampleDiff]
    only_before: int = 0  # examples of `from_step` with no partner at `to_step`
    only_after: int = 0
    notes: list[str] = field(default_factory=list)  # damaged records skipped while reading

    @property
    def counts(self) -> dict[str, int]:
        """Examples per tag, plus `changed` (any tag) and `unchanged`."""
        counts = {tag: sum(tag in x.tags for x in self.examples) for tag in TAGS}
        changed = sum(bool(x.tags) for x in self.examples)
        return {**counts, "changed": changed, "unchanged": len(self.examples) - changed}

    def to_json(self, examples: Iterable[ExampleDiff] | None = None) -> dict[str, Any]:
        shown = self.examples if examples is None else list(examples)
        return {
            "split": self.split,
            "from": self.from_step,
            "to": self.to_step,
            "rule": self.options.rule.describe(),
            "length_margin": self.options.length_margin,
            "compared": len(self.examples),
            "only_before": self.only_before,
            "only_after": self.only_after,
            "counts": self.counts,
            "notes": self.notes,
            "examples": [x.to_json() for x in shown],
        }


def tags_between(before: Answer, after: Answer, options: DiffOptions) -> list[str]:
    """What changed from one answer to the other, in `TAGS` order."""
    tags = []
    if before.right is False and after.right is True:
        tags.append("newly_right")
    if before.right is True and after.right is False:
        tags.append("newly_wrong")
    if before.format != after.format:
        tags.append("format_changed")
    shorter, longer = sorted((before.length, after.length))
    if longer - shorter >= options.min_length_change and longer > shorter * (
        1 + options.length_margin
    ):
        tags.append("length_changed")
    if before.tools != after.tools:
        tags.append("tools_changed")
    return tags


def compare_rows(
    before_rows: list[dict[str, Any]],
    after_rows: list[dict[str, Any]],
    *,
    split: str,
    from_step: int,
    to_step: int,
    options: DiffOptions | None = None,
) -> StepDiff:
    """Pair the examples of two steps by key and tag each pair; rows without an id (a group's
    exception) are not examples."""
    options = options or DiffOptions()
    before, after = _by_key(before_rows), _by_key(after_rows)
    examples = []
    for (kind, key), rows in before.items():
        partners = after.get((kind, key), [])
        for sample, (old, new) in enumerate(zip(rows, partners, strict=False)):
            prompt, _ = split_prompt(conversation_of(old))
            old_answer, new_answer = answer_of(old, options.rule), answer_of(new, options.rule)
            examples.append(
                ExampleDiff(
                    kind,
                    key,
                    sample,
                    prompt,
                    old_answer,
                    new_answer,
                    tags_between(old_answer, new_answer, options),
                )
            )
    paired = len(examples)
    return StepDiff(
        split,
        from_step,
        to_step,
        options,
        examples,
        only_before=sum(map(len, before.values())) - paired,
        only_after=sum(map(len, after.values())) - paired,
    )


def _by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    keyed: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if "id" in row and "exception" not in row:
            keyed.setdefault(example_key(row), []).append(row)
    return keyed


def filter_examples(diff: StepDiff, tag: str = "", text: str = "") -> list[ExampleDiff]:
    """The examples with `tag` (a `TAGS` key, `changed`, `unchanged`, or '' for all) whose
    prompt or answers contain `text`; an unknown tag is a 400 naming the choices."""
    if tag and tag not in TAG_FILTERS:
        raise InvalidRequestError(
            f"Unknown tag {tag!r}: use one of {', '.join(TAG_FILTERS)}.", param="tag"
        )
    shown = []
    needle = text.strip().lower()
    for example in diff.examples:
        if tag == "changed" and not example.tags:
            continue
        if tag == "unchanged" and example.tags:
            continue
        if tag in TAGS and tag not in example.tags:
            continue
        if needle:
            haystack = "\n".join(
                [example.key, example.before.text, example.after.text]
                + [message_text(m) for m in example.prompt]
            )
            if needle not in haystack.lower():
                continue
        shown.append(example)
    return shown


# ------------------------------------------------------------------------- reading the store


def logged_steps(store: ModelStore, split: str) -> list[int]:
    """The steps at which `split` has logged trajectories."""
    return [step for name, step, _ in store.trajectory_files() if name == split]


def load_step_diff(
    store: ModelStore,
    split: str,
    from_step: int,
    to_step: int,
    options: DiffOptions | None = None,
) -> StepDiff:
    """The diff of two logged steps of `split`; 404 naming the steps that exist, 400 when the
    steps are the same or share no example."""
    if from_step == to_step:
        raise StepsNotComparableError(
            f"--from and --to are both step {from_step}: name two different steps "
            "(e.g. the first and the latest step with held-out data).",
            param="to",
        )
    steps = logged_steps(store, split)
    rows, notes = [], []
    for step in (from_step, to_step):
        if step not in steps:
            raise StoreNotFoundError(_no_step_message(store, split, step, steps))
        step_rows, note = _step_rows(store, split, step)
        rows.append(step_rows)
        notes += [f"{split} step {step}: {note}"] if note else []
    diff = compare_rows(
        rows[0], rows[1], split=split, from_step=from_step, to_step=to_step, options=options
    )
    diff.notes = notes
    if not diff.examples:
        raise StepsNotComparableError(
            f"{split} steps {from_step} and {to_step} of {store.project}/{store.name} share no "
            f"example ({diff.only_before} and {diff.only_after} examples): examples are matched "
            'by metadata["scenario_id"], then metadata["scenario"], then the prompt. Log the '
            "same held-out scenarios at both steps, with a stable scenario_id in each "
            "trajectory's metadata.",
            param="from",
        )
    return diff


def _step_rows(store: ModelStore, split: str, step: int) -> tuple[list[dict[str, Any]], str]:
    """The readable rows of one logged step, and a note on what damage was skipped ('' when
    none); a file that cannot be read at all, or that holds no readable record, is a
    `StoreFileDamagedError` naming it and what to do."""
    path = store.trajectories_path(split, step)
    content = read_step_file(store, split, step)
    rows = [row for row in content.rows if _readable_row(row)]
    odd = len(content.rows) - len(rows)
    note = "; ".join(
        [content.note()] * content.damaged
        + [f"{odd} record(s) not shaped as a logged trajectory skipped"] * bool(odd)
    )
    if (note and not rows) or not path.stat().st_size:
        repair = (
            "art-server repairs a damaged file when it loads the model (the original kept "
            "beside it as .damaged), or "
        )
        raise StoreFileDamagedError(
            f"The {split} trajectories of step {step} ({path}) hold no readable record "
            f"({note or 'the file is empty'}): {repair * content.damaged}{log_again(split)}."
        )
    return rows, note


def _readable_row(row: dict[str, Any]) -> bool:
    """Whether a record has the shape the comparison reads (histories of messages, metadata
    and metrics objects): a JSON object of another shape is skipped and counted."""
    histories = row.get("histories", [])
    if not isinstance(histories, list) or not all(isinstance(h, dict) for h in histories):
        return False
    messages = [h.get("messages") or [] for h in histories]
    if not all(isinstance(m, list) and all(isinstance(x, dict) for x in m) for m in messages):
        return False
    for message in (message for history in messages for message in history):
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list) or not all(
            isinstance(call, dict) and isinstance(call.get("function") or {}, dict)
            for call in calls
        ):
            return False
    return all(isinstance(row.get(name) or {}, dict) for name in ("metadata", "metrics"))


def _no_step_message(store: ModelStore, split: str, step: int, steps: list[int]) -> str:
    where = f"{store.project}/{store.name}"
    if steps:
        listed = ", ".join(str(s) for s in steps)
        return (
            f"No {split!r} trajectories at step {step} for {where}: its {split} steps are {listed}."
        )
    splits = sorted({name for name, _, _ in store.trajectory_files()} - {split})
    other = f" (it has {', '.join(splits)})" if splits else ""
    return (
        f"{where} has no {split!r} trajectories at any step{other}: log held-out examples at "
        f'each step you want to compare, with `await model.log(groups, split="{split}")`.'
    )
