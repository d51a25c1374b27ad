"""The static decode step (`ART_DECODE_STEP=static`): rows in the slots of a preallocated cache,
masks from the slots' lengths, shapes in buckets; greedy tokens equal transformers' `generate()`.

For every family of the architecture matrix, in float32: requests of different lengths join a
batch that is decoding, rows finish at different steps, a late request takes a freed slot. Then,
on one family each: the bucket table, the eager shapes outside it, a slot reused without a copy,
columns grown past a bucket mid-decode, an adapter loaded while rows decode, and a wrong value
of the setting refused by name.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig

from art_backend._errors import ModelLoadError
from art_backend.engines._engine import FinishEvent
from art_backend.engines._static_rows import StaticRows
from art_backend.engines._step_shapes import StepShape, step_shape
from art_backend.testing import TorchEngine
from tests.server.engines.test_architectures import finished, generate_alone, greedy, prompt
from tests.support.adapters import load_model, make_random_adapter
from tests.support.tiny_families import FAMILIES, WINDOW, Family, build_family_model

pytestmark = pytest.mark.torch_engine

LLAMA = next(family for family in FAMILIES if family.name == "llama")
GEMMA3 = next(family for family in FAMILIES if family.name == "gemma3")  # sliding + full layers


@pytest.fixture(autouse=True)
def static_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ART_DECODE_STEP", "static")


@pytest.fixture(scope="module", params=FAMILIES, ids=str)
def family(request: pytest.FixtureRequest) -> Family:
    return request.param


@pytest.fixture(scope="module")
def family_dir(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(family, tmp_path_factory.mktemp(family.name))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(LLAMA, tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(GEMMA3, tmp_path_factory.mktemp("gemma3"))


def started_engine(folder: Path, tokenizer, max_batch_size: int = 16) -> TorchEngine:
    # No end token: a random model may sample one at any step, and the tests need their rows to
    # finish at the steps they chose.
    engine = TorchEngine(
        load_model(folder),
        tokenizer,
        eos_token_ids=[],
        context_length=2048,
        max_batch_size=max_batch_size,
    )
    engine.start()
    assert isinstance(engine._rows, StaticRows)
    return engine


async def test_every_family_decodes_as_generate_through_joins_finishes_and_a_reused_slot(
    family_dir: Path,
):
    tokenizer = AutoTokenizer.from_pretrained(family_dir)
    prompts = [prompt(tokenizer, words) for words in (12, 1, 4, 7, 3)]
    assert min(len(ids) for ids in prompts) > WINDOW
    new_tokens = [24, 3, 11, 14, 6]
    engine = started_engine(family_dir, tokenizer)
    try:
        first = engine.submit(greedy(prompts[0], new_tokens[0]))
        assert not isinstance(await first.get(), FinishEvent)  # decoding ...
        with engine.exclusive():  # ... when three more join between two of its steps
            joining = [engine.submit(greedy(prompts[i], new_tokens[i])) for i in (1, 2, 3)]
        results = [await finished(first)] + [await finished(events) for events in joining[:1]]
        # The 3-token row has finished and freed its slot; the first row still decodes.
        late = engine.submit(greedy(prompts[4], new_tokens[4]))
        results += [await finished(events) for events in joining[1:]] + [await finished(late)]
        counters = engine._rows.counters
    finally:
        engine.stop()
    assert engine.metrics.requests_failed == 0
    reference = load_model(family_dir)
    for ids, new, result in zip(prompts, new_tokens, results, strict=True):
        assert result[0].token_ids == generate_alone(reference, ids, new), len(ids)
    assert counters.bucketed_steps > 0 and counters.eager_steps == 0
    assert all(shape.bucketed and shape.slots <= 8 for shape in counters.shapes)


def test_rows_and_columns_round_up_to_their_buckets_and_past_them_run_eager():
    assert step_shape(1, 1) == StepShape(1, 128, True)
    assert step_shape(5, 100) == StepShape(8, 128, True)
    assert step_shape(16, 129) == StepShape(16, 256, True)
    assert step_shape(64, 4096) == StepShape(64, 4096, True)
    assert step_shape(65, 10) == StepShape(128, 128, False)  # rows past 64: multiples of 64
    assert step_shape(3, 5000) == StepShape(4, 5120, False)  # columns past 4096: of 1024
    with pytest.raises(ValueError, match="at least one row"):
        step_shape(0, 10)


def prefilled(rows: int, width: int, seed: int) -> SimpleNamespace:
    """A stand-in for a prefilled DynamicCache: two layers of [rows, 2, width, 4] keys/values."""
    generator = torch.Generator().manual_seed(seed)
    layers = [
        SimpleNamespace(
            keys=torch.randn((rows, 2, width, 4), generator=generator),
            values=torch.randn((rows, 2, width, 4), generator=generator),
        )
        for _ in range(2)
    ]
    return SimpleNamespace(layers=layers)


def left_padded(lengths: list[int]) -> torch.Tensor:
    width = max(lengths)
    return torch.tensor([[0] * (width - n) + [1] * n for n in lengths])


def test_a_finished_rows_slot_is_reused_by_the_next_join_without_a_copy():
    config = LlamaConfig(num_hidden_layers=2, attn_implementation="sdpa")
    rows = StaticRows(config, pad_token_id=0)
    rows.join(prefilled(3, 6, seed=0), left_padded([6, 2, 4]))
    assert rows.slot_of_row == [0, 1, 2] and rows.cache is not None
    keys = rows.cache.keys[0]
    rows.step(torch.tensor([5, 6, 7]), None, ["base"] * 3)
    rows.keep([0, 2])  # row 1 (slot 1) finished
    assert rows.slot_of_row == [0, 2]
    joining = prefilled(1, 5, seed=1)
    rows.join(joining, left_padded([5]))
    assert rows.slot_of_row == [0, 2, 1]  # the freed slot, lowest first
    assert rows.cache.keys[0] is keys and rows.counters.reshapes == 0  # nothing moved
    assert torch.equal(rows.cache.keys[0][1, :, :5], joining.layers[0].keys[0])
    assert rows.cache.lengths.tolist() == [7, 5, 5, 0]  # the step advanced the first rows
    # Out of row order the step scatters tokens into slots and gathers logits back.
    step = rows.step(torch.tensor([1, 2, 3]), None, ["a", "b", "c"])
    assert step.input_ids[:, 0].tolist() == [1, 3, 2, 0]
    assert step.adapters == ["a", "c", "b", "a"]
    assert step.position_ids[:, 0].tolist() == [7, 5, 5, 0]
    assert step.attention_mask[:, 0, 0, :9].long().tolist()[1] == [1] * 6 + [0] * 3
    logits = torch.arange(4.0)[:, None]
    assert rows.batch_logits(logits)[:, 0].tolist() == [0.0, 2.0, 1.0]


async def test_rows_past_the_largest_bucket_decode_eager_as_generate(llama_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    ids = prompt(tokenizer, 2)
    engine = started_engine(llama_dir, tokenizer, max_batch_size=80)
    try:
        choices = await finished(engine.submit(greedy(ids, 4, n=66)), n=66)
        counters = engine._rows.counters
    finally:
        engine.stop()
    expected = generate_alone(load_model(llama_dir), ids, 4)
    assert all(choice.token_ids == expected for choice in choices.values())
    assert counters.shapes == {StepShape(128, 128, False)}
    assert counters.eager_steps > 0 == counters.bucketed_steps


async def test_a_row_that_outgrows_its_columns_moves_to_the_next_bucket(gemma3_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(gemma3_dir)
    long_prompt = prompt(tokenizer, 10)  # 111 tokens: crosses 128 columns while decoding
    short_prompt = prompt(tokenizer, 2)
    assert 100 < len(long_prompt) < 128
    engine = started_engine(gemma3_dir, tokenizer)
    try:
        long_events = engine.submit(greedy(long_prompt, 30))
        short_events = engine.submit(greedy(short_prompt, 30))
        results = [await finished(long_events), await finished(short_events)]
        counters = engine._rows.counters
    finally:
        engine.stop()
    reference = load_model(gemma3_dir)
    for ids, result in zip((long_prompt, short_prompt), results, strict=True):
        assert result[0].token_ids == generate_alone(reference, ids, 30)
    assert {shape.columns for shape in counters.shapes} == {128, 256}
    assert counters.reshapes >= 1


async def test_rows_decode_on_through_an_adapter_loaded_while_they_run(
    llama_dir: Path, tmp_path: Path
):
    """A base row keeps decoding while an adapter loads and a row through it joins: both equal
    `generate()` of their own model (the base, the adapter's PEFT model)."""
    from peft import PeftModel

    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    adapter_dir = make_random_adapter(llama_dir, tmp_path / "adapter", seed=3)
    base_prompt, adapter_prompt = prompt(tokenizer, 5), prompt(tokenizer, 3)
    engine = started_engine(llama_dir, tokenizer)
    try:
        base_events = engine.submit(greedy(base_prompt, 16))
        await base_events.get()  # decoding
        engine.load_adapter("agent@1", adapter_dir)
        request = greedy(adapter_prompt, 8)
        request.adapter = "agent@1"
        results = await asyncio.gather(finished(base_events), finished(engine.submit(request)))
    finally:
        engine.stop()
    assert results[0][0].token_ids == generate_alone(load_model(llama_dir), base_prompt, 16)
    adapted = PeftModel.from_pretrained(load_model(llama_dir), str(adapter_dir)).eval()
    assert results[1][0].token_ids == generate_alone(adapted, adapter_prompt, 8)


def test_a_wrong_setting_is_refused_at_start_by_name(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ART_DECODE_STEP", "graphs")
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    engine = TorchEngine(load_model(llama_dir), tokenizer, eos_token_ids=[], context_length=64)
    with pytest.raises(
        ModelLoadError, match=r"ART_DECODE_STEP='graphs'.*dynamic.*static.*compiled"
    ):
        engine.start()
