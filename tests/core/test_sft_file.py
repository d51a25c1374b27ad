"""SFT ART-style: from a JSONL file (`art_core.utils.sft.train_sft_from_file`), from trajectories
in chunks (`create_sft_dataset_iterator`), and TrainSFTConfig's ART fields (`learning_rate`
schedules, `batch_size="auto"`, `assistant_turns`), on the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import art_core as art
from art_core.errors import UnsupportedOptionError
from art_core.utils.sft import (
    InvalidSFTFileError,
    create_lr_schedule,
    create_sft_dataset_iterator,
    get_file_row_count,
    iterate_file,
    train_sft_from_file,
)
from tests.support.models import fresh_model
from tests.support.scripted_judge import Reply, ScriptedJudge

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def conversations() -> list[dict]:
    """Six lines: single answers, two multi-turn chats, and a tool call with its result."""
    lines: list[dict] = [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} + 1?"},
                {"role": "assistant", "content": str(i + 1)},
            ]
        }
        for i in range(3)
    ]
    lines.append(
        {
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello! How can I help?"},
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
            ]
        }
    )
    lines.append(
        {
            "messages": [
                {"role": "user", "content": "Count to three."},
                {"role": "assistant", "content": "One, two, three."},
                {"role": "user", "content": "Again, backwards."},
                {"role": "assistant", "content": "Three, two, one."},
            ]
        }
    )
    lines.append(
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
                {"role": "assistant", "content": "It is 21 degrees in Paris."},
            ],
            "tools": [WEATHER_TOOL],
        }
    )
    return lines


def write_jsonl(path: Path, lines: list[dict | str]) -> Path:
    path.write_text(
        "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    )
    return path


@pytest.fixture
def sft_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", conversations())


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


# ------------------------------------------------------------------------------ on the backend


async def test_six_conversations_with_a_tool_call_train_from_a_file(
    model: art.TrainableModel, sft_file: Path
):
    result = await train_sft_from_file(model, str(sft_file), batch_size=2, peak_lr=1e-3)
    assert result is not None and result.step == 1 and model.step == 1
    metrics = result.metrics
    assert metrics["examples"] == 6 and metrics["optimizer_steps"] == 3
    assert metrics["batch_size"] == 2 and metrics["trained_tokens"] > 0
    # ART's default linear schedule over 3 batches (no warmup: int(3 * 0.1) = 0) ends at 0.
    assert metrics["learning_rate"] == 0.0
    served = [m.id for m in (await model.openai_client().models.list()).data]
    assert model.get_inference_name() in served


async def test_last_assistant_turn_only_trains_fewer_tokens_than_all(
    model: art.TrainableModel, sft_file: Path
):
    every = await train_sft_from_file(model, str(sft_file), batch_size=3)
    last = await train_sft_from_file(model, str(sft_file), batch_size=3, assistant_turns="last")
    assert every is not None and last is not None
    # Three conversations have earlier assistant turns (one of them the tool call): only
    # their final answers train with "last"; single-answer lines train the same either way.
    assert 0 < last.metrics["trained_tokens"] < every.metrics["trained_tokens"]
    assert last.metrics["examples"] == every.metrics["examples"] == 6


async def test_assistant_turns_last_counts_exactly_the_final_answers(model: art.TrainableModel):
    single = [
        art.Trajectory(messages_and_choices=line["messages"][-2:], tools=line.get("tools"))
        for line in conversations()[3:5]  # the two multi-turn chats, cut to their last exchange
    ]
    whole = [
        art.Trajectory(messages_and_choices=line["messages"], tools=line.get("tools"))
        for line in conversations()[3:5]
    ]
    cut = await model.train_sft(single, art.TrainSFTConfig(batch_size=2))
    last = await model.train_sft(whole, art.TrainSFTConfig(batch_size=2, assistant_turns="last"))
    assert last.metrics["trained_tokens"] == cut.metrics["trained_tokens"]


async def test_batch_size_auto_is_two_trajectories_a_step(
    model: art.TrainableModel, sft_file: Path
):
    examples = [
        art.Trajectory(messages_and_choices=line["messages"], tools=line.get("tools"))
        for line in conversations()[:5]
    ]
    # ART's call shape: positional config, verbose and log_metrics keywords.
    result = await model.train_sft(
        examples, art.TrainSFTConfig(learning_rate=1e-4), verbose=True, log_metrics=True
    )
    assert art.TrainSFTConfig().batch_size == "auto"
    with pytest.raises(art.UnsupportedOptionError, match="TrainSFTConfig fields"):
        await model.train_sft(examples, _config={"packing": True})
    assert result.metrics["batch_size"] == 2 and result.metrics["optimizer_steps"] == 3
    from_file = await train_sft_from_file(model, str(sft_file), batch_size="auto")
    assert from_file is not None and from_file.metrics["optimizer_steps"] == 3


async def test_a_schedule_gives_each_batch_its_rate_and_must_match_the_batches(
    model: art.TrainableModel,
):
    examples = [
        art.Trajectory(messages_and_choices=line["messages"]) for line in conversations()[:4]
    ]
    result = await model.train_sft(
        examples, art.TrainSFTConfig(learning_rate=[1e-3, 2e-4], batch_size=2)
    )
    assert result.metrics["optimizer_steps"] == 2 and result.metrics["learning_rate"] == 2e-4
    with pytest.raises(art.BackendRequestError, match="2 batches") as caught:
        await model.train_sft(examples, art.TrainSFTConfig(learning_rate=[1e-3], batch_size=2))
    assert caught.value.status_code == 400
    assert model.step == 1  # the refused request trained nothing


async def test_final_step_trains_a_segment_of_the_schedule(
    model: art.TrainableModel, sft_file: Path
):
    result = await train_sft_from_file(
        model, str(sft_file), epochs=2, batch_size=2, initial_step=1, final_step=3
    )
    assert result is not None and result.metrics["optimizer_steps"] == 2
    assert result.metrics["examples"] == 4
    assert await train_sft_from_file(model, str(sft_file), initial_step=99) is None
    assert model.step == 1


async def test_a_malformed_line_stops_the_file_before_anything_trains(
    model: art.TrainableModel, tmp_path: Path
):
    path = write_jsonl(tmp_path / "bad.jsonl", [*conversations()[:4], "{not json", ""])
    with pytest.raises(InvalidSFTFileError, match=r"bad\.jsonl, line 5: not JSON") as caught:
        await train_sft_from_file(model, str(path))
    assert caught.value.line == 5 and isinstance(caught.value, ValueError)
    assert model.step == 0 and await model.get_step() == 0


# ------------------------------------------------------------------------------ the file alone


BAD_LINES = [
    ("[1, 2]", "expected an object"),
    (json.dumps({"messages": [], "tools": []}), '"messages" must be a non-empty list'),
    (json.dumps({"message": [{"role": "user", "content": "hi"}]}), "unknown key(s) ['message']"),
    (
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        "messages[0]: unknown role 'robot'",
    ),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "no assistant message"),
    (json.dumps({"messages": [{"role": "user"}]}), "messages[0]: a user message needs"),
    (
        json.dumps({"messages": conversations()[0]["messages"], "tools": {"a": 1}}),
        '"tools" must be a list',
    ),
]


@pytest.mark.parametrize(("line", "words"), BAD_LINES, ids=[w for _, w in BAD_LINES])
def test_each_bad_line_is_named_with_its_line_number(tmp_path: Path, line: str, words: str):
    path = write_jsonl(tmp_path / "data.jsonl", [conversations()[0], "", line])
    with pytest.raises(InvalidSFTFileError) as caught:
        get_file_row_count(str(path))
    assert caught.value.line == 3 and f"line 3: {words}" in str(caught.value)


def test_bytes_that_are_not_utf8_are_named_with_their_line(tmp_path: Path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(json.dumps(conversations()[0]).encode() + b"\n\xff\xfe\n")
    with pytest.raises(InvalidSFTFileError, match="line 2: not UTF-8"):
        get_file_row_count(str(path))


@pytest.mark.parametrize("name", ["data.json", "missing.jsonl"])
def test_only_an_existing_jsonl_file_is_read(tmp_path: Path, name: str):
    if name.endswith(".json"):
        write_jsonl(tmp_path / name, conversations())
    with pytest.raises(InvalidSFTFileError, match=r"Only JSONL|No file"):
        get_file_row_count(str(tmp_path / name))


async def test_arts_experimental_config_is_refused_by_name(sft_file: Path):
    unregistered = art.TrainableModel(name="x", project="p", base_model="tiny")
    with pytest.raises(UnsupportedOptionError, match="_config"):
        await train_sft_from_file(unregistered, str(sft_file), _config={"metric_logging": {}})


def test_iterate_file_repeats_epochs_reshuffled_deterministically(sft_file: Path):
    def contents(trajectories: list[art.Trajectory]) -> list[str]:
        return [t.messages()[0]["content"] for t in trajectories]

    first = list(iterate_file(str(sft_file), epochs=2, shuffle_buffer_size=3))
    again = list(iterate_file(str(sft_file), epochs=2, shuffle_buffer_size=3))
    assert len(first) == 12 and contents(first) == contents(again)
    assert sorted(contents(first[:6])) == sorted(contents(first[6:]))
    assert contents(first[:6]) != contents(first[6:])  # seed + epoch: another order
    resumed = list(iterate_file(str(sft_file), epochs=2, shuffle_buffer_size=3, initial_skip=5))
    assert contents(resumed) == contents(first[5:])
    assert first[5].tools in (None, [WEATHER_TOOL])


def test_learning_rate_schedules_as_art():
    warm = create_lr_schedule(10, 1e-4, method="constant", warmup_steps=5)
    assert warm[0] == pytest.approx(2e-5) and warm[4:] == pytest.approx([1e-4] * 6)
    linear = create_lr_schedule(5, 1e-4, method="linear", min_lr=1e-5)
    assert linear == pytest.approx([1e-4, 7.75e-5, 5.5e-5, 3.25e-5, 1e-5])
    cosine = create_lr_schedule(5, 1e-4, method="cosine", min_lr=1e-5)
    assert cosine[0] == pytest.approx(1e-4) and cosine[2] == pytest.approx(5.5e-5)
    assert cosine[-1] == pytest.approx(1e-5)
    assert create_lr_schedule(0, 1e-4) == [] and create_lr_schedule(1, 1e-4) == [1e-4]
    assert all(rate > 0 for rate in create_lr_schedule(5, 1e-4, warmup_steps=10))
    with pytest.raises(ValueError, match="Unknown method"):
        create_lr_schedule(3, 1e-4, method="step")  # type: ignore[arg-type]


def test_train_sft_config_has_arts_fields_and_defaults():
    config = art.TrainSFTConfig()
    assert (config.learning_rate, config.batch_size, config.assistant_turns) == (
        5e-5,
        "auto",
        "all",
    )
    assert art.TrainSFTConfig(learning_rate=[1e-4, 0.0]).learning_rate == [1e-4, 0.0]
    for bad in ({"learning_rate": []}, {"learning_rate": 0.0}, {"assistant_turns": "first"}):
        with pytest.raises(ValueError):
            art.TrainSFTConfig(**bad)


# ------------------------------------------------- in memory, in chunks: create_sft_dataset_iterator


async def test_arts_distillation_block_trains_the_teachers_answers_chunk_by_chunk(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path, scripted_judge: ScriptedJudge
):
    """docs/fundamentals/sft-training.mdx, "Response-level distillation", as ART writes it; the
    teacher is the scripted server on 127.0.0.1, the student the tiny model on our backend."""
    from openai import AsyncOpenAI

    scripted_judge.default = lambda body: Reply(
        '{"name": "Sarah Chen", "role": "VP of Engineering", "company": "Acme Corp"}'
    )
    TEACHER_MODEL = "z-ai/glm-5"
    teacher_client = AsyncOpenAI(api_key="your-api-key", base_url=scripted_judge.url)
    system_prompt = "Extract {name, role, company} as JSON from the text. Return only valid JSON."
    inputs = [
        "Hi, I'm Sarah Chen, VP of Engineering at Acme Corp.",
        "David Park here — senior data scientist at Globex.",
        "I'm Maria Lopez. I lead product at Initech.",
        "Hey, this is James Wu from Umbrella Corp, working as a DevOps engineer.",
        "My name is Aisha Patel and I'm a research lead at DeepMind.",
    ]
    trajectories = []
    for text in inputs:
        messages = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": text},
        ]
        completion = await teacher_client.chat.completions.create(
            model=TEACHER_MODEL,
            messages=messages,  # type: ignore[arg-type]
        )
        trajectories.append(
            art.Trajectory(
                messages_and_choices=[
                    *messages,
                    {"role": "assistant", "content": completion.choices[0].message.content},
                ],
            )
        )
    student = await fresh_model(remote_backend, tiny_model_dir)  # register(LocalBackend())
    results = []

    for chunk in create_sft_dataset_iterator(trajectories, peak_lr=2e-4):
        results.append(await student.train_sft(chunk.trajectories, chunk.config))

    await teacher_client.close()
    # Five answers, two a batch, ten batches a chunk: one call of three optimizer steps.
    assert [result.step for result in results] == [1] and student.step == 1
    assert results[0].metrics["examples"] == 5 and results[0].metrics["optimizer_steps"] == 3


def _numbered(count: int) -> list[art.Trajectory]:
    return [
        art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": str(k)},
                {"role": "assistant", "content": "ok"},
            ]
        )
        for k in range(count)
    ]


def _numbers(trajectories: list[art.Trajectory]) -> list[int]:
    return [int(t.messages()[0]["content"]) for t in trajectories]


def test_chunks_slice_one_schedule_over_every_batch_of_every_epoch():
    options = dict(
        chunk_size=2, epochs=2, batch_size=2, peak_lr=1e-4, warmup_ratio=0.5, shuffle=False,
        show_progress=False,
    )  # fmt: skip
    chunks = list(create_sft_dataset_iterator(_numbered(5), **options))  # type: ignore[arg-type]

    # Three batches an epoch (the last one short), at most two a chunk; no chunk spans epochs.
    assert [(c.step, c.epoch, c.epoch_step) for c in chunks] == [
        (0, 0, 0),
        (2, 0, 2),
        (3, 1, 0),
        (5, 1, 2),
    ]
    assert [_numbers(c.trajectories) for c in chunks] == [[0, 1, 2, 3], [4], [0, 1, 2, 3], [4]]
    schedule = create_lr_schedule(6, 1e-4, "linear", warmup_steps=3)
    assert [rate for c in chunks for rate in c.config.learning_rate] == schedule  # type: ignore[union-attr]
    assert {c.config.batch_size for c in chunks} == {2}

    resumed = list(create_sft_dataset_iterator(_numbered(5), initial_step=1, **options))  # type: ignore[arg-type]
    assert [(c.step, _numbers(c.trajectories)) for c in resumed][:2] == [(1, [2, 3]), (2, [4])]
    assert resumed[0].config.learning_rate == schedule[1:2]


def test_each_epoch_is_shuffled_with_seed_plus_epoch():
    def orders(seed: int) -> list[list[int]]:
        chunks = create_sft_dataset_iterator(
            _numbered(8), chunk_size=4, epochs=2, seed=seed, show_progress=False
        )
        return [_numbers(c.trajectories) for c in chunks]

    first = orders(seed=7)
    assert first == orders(seed=7) and first != orders(seed=8)
    assert first[0] != first[1] and sorted(first[0]) == list(range(8))
    assert list(create_sft_dataset_iterator([], show_progress=False)) == []
    with pytest.raises(ValueError, match="chunk_size"):
        next(create_sft_dataset_iterator(_numbered(2), chunk_size=0))
