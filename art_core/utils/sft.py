"""Supervised fine-tuning helpers with ART's names and defaults (`art.utils.sft`): from a JSONL
file, or from trajectories in memory in chunks (`create_sft_dataset_iterator`).

Each line of the file is one conversation in OpenAI's fine-tuning format::

    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}], "tools": [...]}

`train_sft_from_file` reads it epoch after epoch (shuffled through a buffer, seed + epoch),
computes the learning rate of every batch (warmup, then linear, cosine or constant decay) and
sends it all as one `model.train_sft` call: one checkpoint at the end, one optimizer step per
batch. Every line is checked before anything trains; a bad one is an `InvalidSFTFileError`
naming its file and line.

`create_sft_dataset_iterator` cuts trajectories already in memory (a teacher's answers, say) into
chunks of batches, one `model.train_sft(chunk.trajectories, chunk.config)` call each, so each
chunk's step has its own metrics; the schedule is computed over every batch of every epoch and
sliced, so warmup and decay run across the chunks as in one call.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import ValidationError
from tqdm.auto import tqdm

from art_core.errors import InvalidSFTFileError, UnsupportedOptionError
from art_core.trajectories import Trajectory
from art_core.types import SFT_AUTO_BATCH_SIZE, TrainResult, TrainSFTConfig
from art_core.utils._jsonl import jsonl_lines

if TYPE_CHECKING:
    from art_core.model import TrainableModel

__all__ = [
    "InvalidSFTFileError",
    "SFTChunk",
    "create_lr_schedule",
    "create_sft_dataset_iterator",
    "get_file_row_count",
    "iterate_file",
    "resolve_sft_batch_size",
    "train_sft_from_file",
]

ScheduleType = Literal["cosine", "linear", "constant"]
LINE_KEYS = ("messages", "tools")
ROLES = ("system", "developer", "user", "assistant", "tool")


def create_lr_schedule(
    total_steps: int,
    peak_lr: float,
    method: ScheduleType = "linear",
    warmup_steps: int = 0,
    min_lr: float = 0.0,
) -> list[float]:
    """One learning rate per step: a linear warmup to `peak_lr`, then `method`'s decay to `min_lr`.

    Warmup step k (from 0) is min_lr + (peak_lr - min_lr) * (k + 1) / warmup_steps, so the first
    step never has rate 0. The decay runs over the remaining steps, ending exactly at `min_lr`.
    """
    if method not in ("cosine", "linear", "constant"):
        raise ValueError(f"Unknown method: {method!r}. Choose from: cosine, linear, constant")
    rates = []
    decay_steps = total_steps - warmup_steps
    for step in range(max(total_steps, 0)):
        if step < warmup_steps:
            rates.append(min_lr + (peak_lr - min_lr) * (step + 1) / warmup_steps)
            continue
        progress = (step - warmup_steps) / (decay_steps - 1) if decay_steps > 1 else 0.0
        if method == "cosine":
            rates.append(min_lr + (peak_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress)))
        elif method == "linear":
            rates.append(peak_lr - (peak_lr - min_lr) * progress)
        else:
            rates.append(peak_lr)
    return rates


def get_file_row_count(file_path: str) -> int:
    """The number of conversations in a JSONL file (its non-blank lines), every one checked."""
    return sum(1 for _ in _read_file(file_path))


def iterate_file(
    file_path: str,
    epochs: int = 1,
    shuffle_buffer_size: int = 10000,
    seed: int = 42,
    initial_skip: int = 0,
) -> Iterator[Trajectory]:
    """The file's conversations as trajectories, `epochs` times, shuffled through a buffer.

    Each epoch shuffles with `random.Random(seed + epoch)`: once the buffer holds
    `shuffle_buffer_size` items, a random one is yielded per line read. `initial_skip` skips that
    many trajectories of the whole stream (to resume).
    """
    if shuffle_buffer_size < 1:
        raise ValueError(f"shuffle_buffer_size must be >= 1, got {shuffle_buffer_size}")
    skipped = 0

    def emit(trajectory: Trajectory) -> Iterator[Trajectory]:
        nonlocal skipped
        if skipped < initial_skip:
            skipped += 1
        else:
            yield trajectory

    for epoch in range(epochs):
        shuffler = random.Random(seed + epoch)
        buffer: list[Trajectory] = []
        for trajectory in _read_file(file_path):
            buffer.append(trajectory)
            if len(buffer) >= shuffle_buffer_size:
                yield from emit(buffer.pop(shuffler.randrange(len(buffer))))
        shuffler.shuffle(buffer)
        for trajectory in buffer:
            yield from emit(trajectory)


class SFTChunk(NamedTuple):
    """One `model.train_sft` call of `create_sft_dataset_iterator`: its trajectories, their config
    (a rate per batch), the global batch it starts at, its epoch, and its batch in that epoch."""

    trajectories: list[Trajectory]
    config: TrainSFTConfig
    step: int
    epoch: int
    epoch_step: int


def create_sft_dataset_iterator(
    trajectories: Iterable[Trajectory],
    chunk_size: int = 10,
    epochs: int = 1,
    batch_size: int | Literal["auto"] = 2,
    peak_lr: float = 2e-4,
    schedule_type: ScheduleType = "linear",
    warmup_ratio: float = 0.1,
    shuffle: bool = True,
    seed: int = 42,
    initial_step: int = 0,
    show_progress: bool = True,
) -> Iterator[SFTChunk]:
    """`SFTChunk`s of up to `chunk_size` batches of `batch_size` trajectories, epoch after epoch.

    ART's signature and defaults. Each epoch is shuffled with `random.Random(seed + epoch)` (when
    `shuffle`); a chunk never spans two epochs. The rates come from `create_lr_schedule` over all
    batches with `int(batches * warmup_ratio)` warmup steps. `initial_step` resumes at that global
    batch: the batches before it are left out. `show_progress` shows a bar of batches.
    """
    size = _positive_batch_size(batch_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not 0 <= warmup_ratio <= 1:
        raise ValueError(f"warmup_ratio must be between 0 and 1, got {warmup_ratio}")
    items = list(trajectories)
    if not items:
        return
    per_epoch = math.ceil(len(items) / size)
    total = per_epoch * epochs
    schedule = create_lr_schedule(total, peak_lr, schedule_type, int(total * warmup_ratio))
    bar = tqdm(
        initial=min(initial_step, total), total=total, desc="SFT Training", unit="step",
        disable=not show_progress,
    )  # fmt: skip
    with bar:
        for epoch in range(epochs):
            order = list(items)
            if shuffle:
                random.Random(seed + epoch).shuffle(order)
            offset = epoch * per_epoch  # the global step of this epoch's first batch
            for first in range(0, per_epoch, chunk_size):
                start = max(first, initial_step - offset)  # the batches before were trained
                stop = min(first + chunk_size, per_epoch)
                if start >= stop:
                    continue
                rates = schedule[offset + start : offset + stop]
                yield SFTChunk(
                    trajectories=order[start * size : stop * size],
                    config=TrainSFTConfig(learning_rate=rates, batch_size=size),
                    step=offset + start,
                    epoch=epoch,
                    epoch_step=start,
                )
                bar.update(stop - start)


def resolve_sft_batch_size(*, batch_size: int | Literal["auto"], default_batch_size: int) -> int:
    """ART's helper: `batch_size`, or `default_batch_size` where it is "auto"."""
    return default_batch_size if batch_size == "auto" else batch_size


def _positive_batch_size(batch_size: int | Literal["auto"]) -> int:
    size = resolve_sft_batch_size(batch_size=batch_size, default_batch_size=SFT_AUTO_BATCH_SIZE)
    if not isinstance(size, int) or size < 1:
        raise ValueError(f'batch_size must be a positive integer or "auto", got {batch_size!r}')
    return size


async def train_sft_from_file(
    model: TrainableModel,
    file_path: str,
    epochs: int = 1,
    batch_size: int | Literal["auto"] = 2,
    peak_lr: float = 2e-4,
    schedule_type: ScheduleType = "linear",
    warmup_ratio: float = 0.1,
    initial_step: int = 0,
    final_step: int | None = None,
    _config: Any = None,
    verbose: bool = False,
    shuffle_buffer_size: int = 10000,
    log_metrics: bool = True,
    assistant_turns: Literal["all", "last"] = "all",
) -> TrainResult | None:
    """Supervised fine-tuning on a JSONL file of conversations, as one `model.train_sft` call.

    ART's signature and defaults. Batches count over all epochs (`initial_step`/`final_step`
    select a range of them, to resume or to train in segments); the rate of each comes from
    `create_lr_schedule` with `int(batches * warmup_ratio)` warmup steps. Returns the step's
    result (ART returns None), or None when there is nothing to train. The step's metrics are
    always kept in the model's history, so `log_metrics` changes nothing; `_config` (ART's
    experimental options) must be None.
    """
    if _config is not None:
        raise UnsupportedOptionError(
            "train_sft_from_file(_config=...) (ART's experimental SFT options) is not "
            "supported by this backend; leave it out."
        )
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if not 0 <= warmup_ratio <= 1:
        raise ValueError(f"warmup_ratio must be between 0 and 1, got {warmup_ratio}")
    size = _positive_batch_size(batch_size)
    rows = get_file_row_count(file_path)  # checks every line before anything trains
    if verbose:
        print(f"File has {rows} rows")
    total = rows * epochs
    skip = initial_step * size
    if total == 0 or skip >= total:
        if verbose:
            print("No trajectories to train on")
        return None
    batches = math.ceil(total / size)
    schedule = create_lr_schedule(
        total_steps=batches,
        peak_lr=peak_lr,
        method=schedule_type,
        warmup_steps=int(batches * warmup_ratio),
    )
    rates = schedule[initial_step : min(final_step, batches) if final_step is not None else None]
    if not rates:
        return None
    if verbose:
        print(f"Training {len(rates)} batches of {size} ({schedule_type}, peak_lr {peak_lr})")
    trajectories = list(
        itertools.islice(
            iterate_file(file_path, epochs, shuffle_buffer_size, initial_skip=skip),
            len(rates) * size,
        )
    )
    config = TrainSFTConfig(learning_rate=rates, batch_size=size, assistant_turns=assistant_turns)
    return await model.train_sft(trajectories, config)


# ------------------------------------------------------------------------------ reading lines


def _read_file(file_path: str) -> Iterator[Trajectory]:
    """Every non-blank line of the file as a trajectory; the first bad line raises."""
    if not str(file_path).endswith(".jsonl"):
        raise InvalidSFTFileError(
            f"Only JSONL files are supported (one conversation per line, a .jsonl name). "
            f"Got: {file_path}",
            path=str(file_path),
        )

    def fail(message: str, line: int | None) -> InvalidSFTFileError:
        return InvalidSFTFileError(message, path=str(file_path), line=line)

    for number, text, data in jsonl_lines(file_path, fail):
        yield _trajectory_from_line(data, text, str(file_path), number)


def _trajectory_from_line(data: Any, text: str, path: str, number: int) -> Trajectory:
    def bad(problem: str) -> InvalidSFTFileError:
        return InvalidSFTFileError(f"{path}, line {number}: {problem}", path=path, line=number)

    if not isinstance(data, dict):
        raise bad(f'expected an object {{"messages": [...], "tools": [...]}}, got {text[:80]!r}')
    if unknown := sorted(set(data) - set(LINE_KEYS)):
        raise bad(f"unknown key(s) {unknown}; a line has {' and '.join(LINE_KEYS)} only")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad('"messages" must be a non-empty list of chat messages')
    for index, message in enumerate(messages):
        if problem := _message_problem(message):
            raise bad(f"messages[{index}]: {problem}")
    if not any(message["role"] == "assistant" for message in messages):
        raise bad("no assistant message to train on")
    tools = data.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)
    ):
        raise bad('"tools" must be a list of OpenAI tool definitions')
    try:
        return Trajectory(messages_and_choices=messages, tools=tools)
    except ValidationError as error:
        raise bad(str(error)) from None


def _message_problem(message: Any) -> str | None:
    """What is wrong with one chat message, or None (the backend checks the rest)."""
    if not isinstance(message, dict):
        return f"a message must be an object with a role, got {message!r}"
    role = message.get("role")
    if role not in ROLES:
        return f"unknown role {role!r}: use one of {', '.join(ROLES)}"
    content = message.get("content")
    if content is None:
        if role == "assistant" and message.get("tool_calls"):
            return None
        return f"a {role} message needs `content`"
    if not isinstance(content, str | list):
        return "content must be a string or a list of text parts"
    return None
