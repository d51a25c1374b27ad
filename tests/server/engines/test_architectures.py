"""The architecture matrix: every family users bring is served, batched and trained correctly.

For each family of `tests/support/tiny_families.py` (Llama, Qwen2, Qwen3, Gemma 3 with sliding +
full layers, Mistral's sliding window, Phi-3, SmolLM3, Qwen3-MoE, GPT-OSS) on the torch engine:
requests of different lengths join a batch that is already decoding, rows finish at different
times, prompts run past the sliding window, a group's prompt is prefilled once, and every
request's greedy tokens equal transformers' `generate()` on that request alone. Then a GRPO step
on the engine's own samples trains with a ratio of 1 (the trainer's logprobs equal the
engine's), through shared-prefix packing where the family allows it, and the Tinker API's
scoring of the same samples (`forward_backward` of its datums, packed and padded) gives the engine's
logprobs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers import AutoTokenizer

from art_backend._errors import UnsupportedModelError
from art_backend.engines._engine import FinishEvent, GenerationRequest, SamplingParams
from art_backend.engines._kv_cache import check_servable
from art_backend.engines._prefill_groups import prefill_groups
from art_backend.testing import LoraTrainer, OptimizerSettings, TorchEngine, loss_preset
from art_backend.tinker._datums import datum_rows
from art_backend.tinker._proto import ForwardBackwardWire, WireDatum, WireTensor
from art_backend.training._losses import LOSSES, DatumLoss
from art_backend.training._rows import Sequence, pack_rows
from tests.support.adapters import load_model
from tests.support.tiny_families import (
    FAMILIES,
    UNSERVABLE,
    WINDOW,
    Family,
    build_family_model,
)

pytestmark = pytest.mark.torch_engine

MAX_NEW_TOKENS = [20, 6, 11, 14]  # rows finish at different steps


@pytest.fixture(scope="module", params=FAMILIES, ids=str)
def family(request: pytest.FixtureRequest) -> Family:
    return request.param


@pytest.fixture(scope="module")
def family_dir(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(family, tmp_path_factory.mktemp(family.name))


def prompt(tokenizer, words: int) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "the quick brown fox " * words}],
        add_generation_prompt=True,
        tokenize=False,
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


def started_engine(folder: Path, tokenizer, *, eos: bool = True) -> TorchEngine:
    engine = TorchEngine(
        load_model(folder),
        tokenizer,
        eos_token_ids=[tokenizer.eos_token_id] if eos else [],
        context_length=2048,
        max_batch_size=16,
    )
    engine.start()
    return engine


async def finished(events: asyncio.Queue, n: int = 1) -> dict[int, FinishEvent]:
    done: dict[int, FinishEvent] = {}
    while len(done) < n:
        event = await events.get()
        if isinstance(event, FinishEvent):
            done[event.choice_index] = event
    return done


def greedy(ids: list[int], max_new_tokens: int, n: int = 1) -> GenerationRequest:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    return GenerationRequest(prompt_ids=ids, params=params, n=n)


def generate_alone(model, ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy, without an end token (as the engine under test): every row runs its length."""
    model.generation_config.eos_token_id = None
    output = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return output[0, len(ids) :].tolist()


async def test_staggered_mixed_length_batches_decode_as_each_request_alone(family_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(family_dir)
    # 12 to 60-odd tokens: every prompt is past the sliding window (WINDOW), the longest by far.
    prompts = [prompt(tokenizer, words) for words in (12, 1, 4, 7)]
    assert min(len(ids) for ids in prompts) > WINDOW
    # No end token: a random model may sample one at any step, and the test needs its rows to
    # finish at the steps it chose.
    engine = started_engine(family_dir, tokenizer, eos=False)
    try:
        first = engine.submit(greedy(prompts[0], MAX_NEW_TOKENS[0]))
        event = await first.get()  # the first request is decoding ...
        assert not isinstance(event, FinishEvent), event
        # ... when the others join it between two of its steps: two requests for one prompt
        # (prefilled once), and one with n=2.
        with engine.exclusive():
            joining = [
                engine.submit(greedy(ids, new, n=2 if index == 3 else 1))
                for index, (ids, new) in enumerate(zip(prompts, MAX_NEW_TOKENS, strict=True))
                if index > 0
            ]
            twin = engine.submit(greedy(prompts[1], MAX_NEW_TOKENS[1]))
        results = [
            await finished(first),
            *[await finished(events, n=2 if i == 2 else 1) for i, events in enumerate(joining)],
        ]
        twin_result = await finished(twin)
    finally:
        engine.stop()
    assert engine.metrics.requests_failed == 0
    # The first alone, then the joiners in groups of similar lengths (`_prefill_groups.py`).
    joiners = [SimpleNamespace(prompt_ids=ids, adapter=None) for ids in prompts[1:]]
    assert engine.metrics.prefill_batches_total == 1 + len(prefill_groups(joiners))
    assert engine.metrics.max_batch_size_seen == 6  # merged into the running batch
    assert engine.metrics.prefill_shared_requests_total >= 1
    reference = load_model(family_dir)
    for ids, new, result in zip(prompts, MAX_NEW_TOKENS, results, strict=True):
        expected = generate_alone(reference, ids, new)
        for choice in result.values():
            assert choice.token_ids == expected, (len(ids), choice.error)
    assert twin_result[0].token_ids == results[1][0].token_ids


async def test_a_grpo_step_on_the_engines_samples_has_a_ratio_of_one(
    family_dir: Path,
):
    """float32: the trainer's logprobs of the sampled tokens equal the engine's to 1e-3."""
    tokenizer = AutoTokenizer.from_pretrained(family_dir)
    engine = started_engine(family_dir, tokenizer)
    try:
        suffixes = {name.rsplit(".", 1)[-1] for name in engine.adaptable_modules}
        targets = [
            name
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")
            if name in suffixes
        ]
        lora = {"r": 4, "alpha": 8, "target_modules": targets}
        packed, padded = (LoraTrainer(engine, name, lora, seed=1) for name in ("packed", "padded"))
        padded.packs_prefixes = False
        sequences: list[Sequence] = []
        for group, words in enumerate((2, 9)):  # the second group's prompt is past the window
            ids = prompt(tokenizer, words)
            params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=group)
            request = GenerationRequest(prompt_ids=ids, params=params, n=4)
            choices = await finished(engine.submit(request), n=4)
            for index, choice in choices.items():
                sequences.append(sampled_sequence(ids, choice, group, advantage=index - 1.5))
        # The Tinker API's scoring of the same samples (`forward_backward` of its datums),
        # packed and padded.
        scores = [tinker_scores(trainer, sequences, engine) for trainer in (packed, padded)]
        rows, dropped = pack_rows(sequences, max_length=4096, mask_truncated=False)
        assert not any(dropped.values())
        settings = OptimizerSettings(learning_rate=1e-3, micro_batch_tokens=4096)
        metrics, padded_metrics = (
            trainer.grpo_step(rows, loss_preset("grpo"), settings, beta=0.0)
            for trainer in (packed, padded)
        )
    finally:
        engine.stop()
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["grad_norm"] > 0
    # A group's samples share their prompt: it goes through the model once (sliding layers
    # with a windowed mask), and the step equals the padded one.
    assert metrics["shared_prefix_tokens"] > 0 == padded_metrics["shared_prefix_tokens"]
    for key in ("loss", "grad_norm", "entropy", "ratio_mean"):
        assert metrics[key] == pytest.approx(padded_metrics[key], rel=1e-4, abs=1e-6), key
    # Scored through the Tinker API's path, each sample's tokens have the engine's logprobs, and
    # the datums packed over their prompt score as the padded ones.
    for sequence, from_pack, from_padding in zip(sequences, *scores, strict=True):
        assert torch.allclose(from_pack, from_padding, atol=1e-5)
        sampled = sequence.trained_mask[1:]
        expected = sequence.old_logprobs[1:][sampled]
        assert torch.allclose(from_pack[sampled], expected, atol=1e-3)


def tinker_scores(trainer: LoraTrainer, sequences: list[Sequence], engine) -> list[torch.Tensor]:
    """Each sequence's logprobs as a Tinker datum (inputs [:-1], targets [1:]), scored forward
    only through the trainer's one `forward_backward`."""
    data = [
        WireDatum(
            tokens=s.input_ids[:-1].tolist(),
            inputs={"target_tokens": WireTensor(s.input_ids[1:].numpy())},
        )
        for s in sequences
    ]
    wire = ForwardBackwardWire("run", 1, "cross_entropy", {}, True, data)
    loss = LOSSES["cross_entropy"]
    rows = datum_rows(wire, loss, vocabulary=engine.vocab_size, context=engine.context_length)
    scoring = DatumLoss(loss, {})
    trainer.forward_backward(rows, scoring, OptimizerSettings(), backward=False, share_trained=True)
    return [scoring.logprobs[number] for number in range(len(sequences))]


def sampled_sequence(
    prompt_ids: list[int], choice: FinishEvent, group: int, *, advantage: float
) -> Sequence:
    tokens = prompt_ids + choice.token_ids
    trained = torch.zeros(len(tokens), dtype=torch.bool)
    trained[len(prompt_ids) :] = True
    old = torch.zeros(len(tokens))
    old[len(prompt_ids) :] = torch.tensor(choice.logprobs)
    return Sequence(
        input_ids=torch.tensor(tokens),
        trained_mask=trained,
        old_logprobs=old,
        advantage=advantage,
        trajectory_id=f"g{group}-{choice.choice_index}",
        group_id=group,
        truncated=False,
    )


@pytest.mark.parametrize(
    ("config_class", "family", "layer_type"),
    [
        ("Qwen3NextConfig", "qwen3_next", "linear_attention"),  # recurrent state
        ("Llama4TextConfig", "llama4_text", "chunked_attention"),  # chunks at absolute positions
        ("FalconH1Config", "falcon_h1", "hybrid"),  # Mamba beside attention
        ("Gemma3nTextConfig", "gemma3n_text", "dummy"),  # layers reading another layer's KV
    ],
)
def test_a_family_whose_cache_the_engine_cannot_batch_is_named_and_refused(
    config_class: str, family: str, layer_type: str
):
    with pytest.raises(UnsupportedModelError, match=f"'{family}'.*{layer_type}.*--engine vllm"):
        check_servable(getattr(transformers, config_class)())


def test_the_server_refuses_such_a_family_at_start_not_with_a_500_later(tmp_path: Path):
    folder = build_family_model(UNSERVABLE, tmp_path / "model")
    result = subprocess.run(
        [sys.executable, "-m", "art_backend.cli", "--model", str(folder), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "ART_DTYPE_PROBE": "0"},
    )
    assert result.returncode != 0
    assert "cannot serve 'qwen3_next' models" in result.stderr
    assert "Traceback" not in result.stderr
