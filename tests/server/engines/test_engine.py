"""The torch engine: continuous batching matches plain generate(), rows fail alone, adapters mix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from art_backend.engines._engine import (
    Engine,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    TrainableEngine,
)
from art_backend.testing import TorchEngine
from tests.support.adapters import load_model, make_random_adapter


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def started_engine(tiny_model_dir: Path, tokenizer, **limits: int) -> TorchEngine:
    """A running torch engine on a fresh copy of the tiny model; `limits` are its batch bounds."""
    engine = TorchEngine(
        load_model(tiny_model_dir),
        tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        context_length=2048,
        **limits,
    )
    engine.start()
    return engine


@pytest.fixture
def engine(tiny_model_dir: Path, tokenizer):
    engine = started_engine(tiny_model_dir, tokenizer, max_batch_size=8)
    yield engine
    engine.stop()


def prompt_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


async def run(engine: Engine, request: GenerationRequest) -> dict[int, FinishEvent]:
    events = engine.submit(request)
    finished: dict[int, FinishEvent] = {}
    while len(finished) < request.n:
        event = await events.get()
        if isinstance(event, FinishEvent):
            finished[event.choice_index] = event
    return finished


def greedy(ids: list[int], max_new_tokens: int = 12, **kwargs) -> GenerationRequest:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    return GenerationRequest(prompt_ids=ids, params=params, **kwargs)


def reference_generate(model, ids: list[int], max_new_tokens: int, eos: int) -> list[int]:
    output = model.generate(
        torch.tensor([ids]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return output[0, len(ids) :].tolist()


async def test_batched_greedy_output_equals_plain_generate(engine, tokenizer, tiny_model_dir):
    """Prompts of different lengths joining at different times decode exactly as alone."""
    prompts = [prompt_ids(tokenizer, "hello " * (i + 1)) for i in range(10)]
    staggered = []
    for index, ids in enumerate(prompts):
        staggered.append(asyncio.create_task(run(engine, greedy(ids, max_new_tokens=8 + index))))
        await asyncio.sleep(0.01 * (index % 3))  # new requests join a running batch
    results = await asyncio.gather(*staggered)
    reference = load_model(tiny_model_dir)
    for index, (ids, finished) in enumerate(zip(prompts, results, strict=True)):
        expected = reference_generate(reference, ids, 8 + index, tokenizer.eos_token_id)
        assert finished[0].token_ids == expected
    assert engine.metrics.max_batch_size_seen > 1


async def test_the_kv_token_budget_bounds_the_batch(tiny_model_dir: Path, tokenizer):
    """Rows x (prompt + max new tokens) stays within max_batch_tokens: what does not fit waits
    for rows to finish, and every request still completes as it would alone."""
    ids = prompt_ids(tokenizer, "a budget of tokens")
    row = len(ids) + 6  # one row's most tokens in the KV cache
    # Three rows fit in the budget, a fourth waits.
    engine = started_engine(tiny_model_dir, tokenizer, max_batch_size=64, max_batch_tokens=3 * row)
    try:
        with engine.exclusive():  # all six queue while the engine waits
            tasks = [asyncio.create_task(run(engine, greedy(ids, 6))) for _ in range(6)]
            await asyncio.sleep(0.1)
        results = await asyncio.gather(*tasks)
    finally:
        engine.stop()
    assert engine.metrics.max_batch_size_seen == 3
    assert len({tuple(finished[0].token_ids) for finished in results}) == 1  # greedy, same
    # A request larger than the whole budget alone still runs (alone).
    engine = started_engine(tiny_model_dir, tokenizer, max_batch_tokens=row - 1)
    try:
        finished = await run(engine, greedy(ids, 6))
    finally:
        engine.stop()
    assert finished[0].finish_reason in ("stop", "length")


async def test_n_choices_share_one_prefill(engine, tokenizer):
    ids = prompt_ids(tokenizer, "four samples please")
    request = GenerationRequest(
        prompt_ids=ids, params=SamplingParams(max_new_tokens=6, seed=3), n=4
    )
    before = engine.metrics.prefill_tokens_total
    finished = await run(engine, request)
    assert sorted(finished) == [0, 1, 2, 3]
    assert engine.metrics.prefill_tokens_total - before == len(ids)


async def test_a_groups_requests_for_one_prompt_share_one_prefill(engine, tokenizer):
    """A GRPO group sends one prompt several times at once: it is prefilled once, and each
    request decodes as it would alone (greedy: the same tokens as plain generate)."""
    ids = prompt_ids(tokenizer, "one prompt, four rollouts")
    other = prompt_ids(tokenizer, "another prompt")
    prefilled, shared = (
        engine.metrics.prefill_tokens_total,
        engine.metrics.prefill_shared_requests_total,
    )
    with engine.exclusive():  # queued while the engine waits: admitted together
        tasks = [asyncio.create_task(run(engine, greedy(ids, max_new_tokens=6))) for _ in range(4)]
        tasks.append(asyncio.create_task(run(engine, greedy(other, max_new_tokens=6))))
        await asyncio.sleep(0.05)
    results = await asyncio.gather(*tasks)
    assert engine.metrics.prefill_tokens_total - prefilled == len(ids) + len(other)
    assert engine.metrics.prefill_shared_requests_total - shared == 3
    assert len({tuple(result[0].token_ids) for result in results[:4]}) == 1
    alone = await run(engine, greedy(ids, max_new_tokens=6))
    assert results[0][0].token_ids == alone[0].token_ids


async def test_a_failing_row_does_not_fail_its_batch(engine, tokenizer):
    class ExplodingConstraint:
        def apply_to_logits(self, logits: torch.Tensor) -> None:
            raise RuntimeError("boom")

        def advance(self, token_id: int) -> None:
            pass

    ids = prompt_ids(tokenizer, "shared batch")
    healthy = [asyncio.create_task(run(engine, greedy(ids, max_new_tokens=10))) for _ in range(3)]
    broken = asyncio.create_task(
        run(engine, greedy(ids, constraint_factory=lambda: ExplodingConstraint()))
    )
    results = await asyncio.gather(*healthy)
    failed = await broken
    assert failed[0].finish_reason == "error" and "boom" in (failed[0].error or "")
    assert all(result[0].finish_reason == "length" for result in results)
    assert all(len(result[0].token_ids) == 10 for result in results)


async def test_a_failing_grammar_factory_fails_only_its_request(engine, tokenizer):
    def factory():
        raise ValueError("bad grammar state")

    ids = prompt_ids(tokenizer, "x")
    good = asyncio.create_task(run(engine, greedy(ids, max_new_tokens=5)))
    bad = await run(engine, greedy(ids, constraint_factory=factory))
    assert bad[0].finish_reason == "error"
    assert (await good)[0].finish_reason == "length"


async def test_cancelled_request_leaves_the_batch(engine, tokenizer):
    ids = prompt_ids(tokenizer, "long one")
    request = greedy(ids, max_new_tokens=400)
    events = engine.submit(request)
    await events.get()  # first token arrived: the request is running
    request.cancel()
    while True:
        event = await events.get()
        if isinstance(event, FinishEvent):
            break
    assert event.finish_reason == "cancelled"
    assert len(event.token_ids) < 400


async def test_stop_string_truncates_text_and_keeps_tokens(engine, tokenizer):
    ids = prompt_ids(tokenizer, "stop test")

    def seeded(stop: list[str]) -> GenerationRequest:
        params = SamplingParams(max_new_tokens=30, temperature=1.0, seed=7, stop=stop)
        return GenerationRequest(prompt_ids=ids, params=params)

    free = (await run(engine, seeded([])))[0]
    text = free.text
    middle = len(text) // 2
    stop = text[middle : middle + 2]
    assert stop.strip() and text.find(stop) > 0
    stopped = (await run(engine, seeded([stop])))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[: text.find(stop)]
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]


async def test_adapters_share_base_weights_and_mix_in_one_batch(
    engine, tokenizer, tiny_model_dir, tmp_path
):
    base_weight = engine.model.model.layers[0].self_attn.q_proj.weight
    ids = prompt_ids(tokenizer, "which adapter am I")
    before_adapters = (await run(engine, greedy(ids)))[0].token_ids
    engine.load_adapter("agent@1", make_random_adapter(tiny_model_dir, tmp_path / "1", seed=1))
    engine.load_adapter("agent@2", make_random_adapter(tiny_model_dir, tmp_path / "2", seed=2))
    peft_layer = engine.model.base_model.model.model.layers[0].self_attn.q_proj
    assert peft_layer.base_layer.weight.data_ptr() == base_weight.data_ptr()

    alone = {}
    for adapter in (None, "agent@1", "agent@2"):
        alone[adapter] = (await run(engine, greedy(ids, adapter=adapter)))[0].token_ids
    assert alone[None] != alone["agent@1"] != alone["agent@2"]
    # the base model with adapters loaded (their layers bypassed) is the model before them,
    # and bypassing them for a base batch leaves them on for the next adapter batch
    assert alone[None] == before_adapters
    assert (await run(engine, greedy(ids, adapter="agent@1")))[0].token_ids == alone["agent@1"]

    shared = engine.metrics.prefill_shared_requests_total
    with engine.exclusive():  # one admission: one prompt, three adapters, three prefill rows
        pending = [
            asyncio.create_task(run(engine, greedy(ids, adapter=adapter)))
            for adapter in (None, "agent@1", "agent@2")
        ]
        await asyncio.sleep(0.05)
    mixed = await asyncio.gather(*pending)
    assert [result[0].token_ids for result in mixed] == list(alone.values())
    assert engine.metrics.prefill_shared_requests_total == shared  # an adapter's prompt is its own

    engine.unload_adapter("agent@2")
    assert "agent@2" not in engine.adapters


async def test_held_back_stop_prefix_is_released_when_the_stop_never_comes(engine, tokenizer):
    ids = prompt_ids(tokenizer, "held back")
    params = SamplingParams(max_new_tokens=25, temperature=1.0, seed=11)
    free = (await run(engine, GenerationRequest(prompt_ids=ids, params=params)))[0]
    never = free.text[-1] + "\x00"  # its first character ends the text; the whole never appears
    params = SamplingParams(max_new_tokens=25, temperature=1.0, seed=11, stop=[never])
    request = GenerationRequest(prompt_ids=ids, params=params)
    events = engine.submit(request)
    deltas = []
    while True:
        event = await events.get()
        if isinstance(event, FinishEvent):
            break
        deltas.append(event.text_delta)
    assert event.finish_reason == free.finish_reason
    assert event.text == free.text == "".join(deltas)
    assert event.text == tokenizer.decode(event.token_ids, skip_special_tokens=True)


def test_the_torch_engine_implements_both_seams(engine) -> None:
    """The chat service talks to `Engine`, the trainer to `TrainableEngine`: the torch engine is both."""
    assert isinstance(engine, Engine)
    assert isinstance(engine, TrainableEngine)
    assert engine.vocab_size >= len(engine.tokenizer)  # every token id has a logit


async def test_a_decode_step_is_split_into_the_forward_sampling_and_the_rows(engine, tokenizer):
    """/metrics' art_decode_{forward,sampling,rows}_seconds_total: the three parts of every
    decode step, within the engine's busy time (gpu_smoke reports the shares)."""
    await run(engine, greedy(prompt_ids(tokenizer, "time the halves"), max_new_tokens=8))
    metrics = engine.metrics
    assert metrics.decode_steps_total >= 7
    assert metrics.decode_forward_seconds_total > 0 and metrics.decode_sampling_seconds_total > 0
    assert metrics.decode_rows_seconds_total > 0
    parts = (
        metrics.decode_forward_seconds_total
        + metrics.decode_sampling_seconds_total
        + metrics.decode_rows_seconds_total
    )
    assert parts <= metrics.busy_seconds_total


async def test_a_new_step_reuses_the_layers_of_the_step_it_replaces(
    engine, tokenizer, tiny_model_dir, tmp_path
):
    """`_adapter_reuse`: the layers of an adapter unloaded while another is served take the next
    adapter of the same shape (its values exactly, as PEFT's load gives them); another shape
    gets layers of its own; with nothing loaded the model is plain again."""
    from peft import LoraConfig, get_peft_model

    ids = prompt_ids(tokenizer, "which step am I")
    third = make_random_adapter(tiny_model_dir, tmp_path / "3", seed=3)
    fresh = started_engine(tiny_model_dir, tokenizer)  # PEFT's own load of the third step
    try:
        fresh.load_adapter("agent@3", third)
        expected = (await run(fresh, greedy(ids, adapter="agent@3")))[0].token_ids
    finally:
        fresh.stop()

    # A run's steps: each new step is loaded, then the oldest unloaded (the served window).
    engine.load_adapter("agent@1", make_random_adapter(tiny_model_dir, tmp_path / "1", seed=1))
    first_layers = engine.adapters["agent@1"]
    first_tokens = (await run(engine, greedy(ids, adapter="agent@1")))[0].token_ids
    engine.load_adapter("agent@2", make_random_adapter(tiny_model_dir, tmp_path / "2", seed=2))
    second_layers = engine.adapters["agent@2"]
    engine.unload_adapter("agent@1")
    engine.load_adapter("agent@3", third)
    assert engine.adapters["agent@3"] == first_layers  # the same layers, no new adapter
    assert set(engine.model.peft_config) == {first_layers, second_layers}
    tokens = (await run(engine, greedy(ids, adapter="agent@3")))[0].token_ids
    assert tokens == expected != first_tokens

    torch.manual_seed(4)  # another rank: layers of its own
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(load_model(tiny_model_dir), config).save_pretrained(tmp_path / "r8")
    engine.unload_adapter("agent@2")
    engine.load_adapter("agent@4", tmp_path / "r8")
    assert engine.adapters["agent@4"] not in (first_layers, second_layers)
    for name in ("agent@3", "agent@4"):  # nothing served: nothing kept, the model plain again
        engine.unload_adapter(name)
    assert not hasattr(engine.model, "peft_config")
    assert (await run(engine, greedy(ids)))[0].token_ids
