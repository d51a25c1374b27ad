"""In bf16 on a CPU the sampler's logprobs are the trainer's, bit for bit (`_batch_invariant`).

For every family of the architecture matrix, in bf16: the engine samples two groups of four
(rows of different lengths decode left-padded in one batch) and one request alone (a one-row
decode); the trainer scores the same tokens packed behind the shared prompt and padded, through
the Tinker path and through a GRPO step. Every logprob is equal, not close, and the step's ratio
is exactly 1. Without the batch-invariant attention and the linear layers' row floors the same
comparison differs by ~1e-2 (SmolLM2: `benchmarks/logprob_gap.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from art_backend._errors import ModelLoadError
from art_backend.engines import _packed_linear
from art_backend.engines._batch_invariant import (
    float64_attention,
    floor_linear_rows,
    is_batch_invariant,
    make_batch_invariant,
)
from art_backend.engines._engine import GenerationRequest, SamplingParams, TokenEvent
from art_backend.engines._loading import load_model
from art_backend.engines._sibling_linear import MEMBER
from art_backend.testing import LoraTrainer, OptimizerSettings, TorchEngine, loss_preset
from art_backend.training._rows import Sequence, pack_rows
from tests.server.engines.test_architectures import (
    finished,
    prompt,
    sampled_sequence,
    tinker_scores,
)
from tests.support.tiny_families import FAMILIES, Family, build_family_model

pytestmark = pytest.mark.torch_engine


@pytest.fixture(scope="module", params=FAMILIES, ids=str)
def family(request: pytest.FixtureRequest) -> Family:
    return request.param


@pytest.fixture(scope="module")
def family_dir(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(family, tmp_path_factory.mktemp(family.name))


@pytest.mark.parametrize("packing", ["as-loaded", "every-layer"])
async def test_engine_and_trainer_logprobs_are_equal_in_bf16(
    family_dir: Path, packing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`every-layer`: the tiny layers packed too (below `MIN_WEIGHT` they stay dense), so q/k/v
    and gate/up run as one call where the family names them so (`_sibling_linear`)."""
    if packing == "every-layer":
        monkeypatch.setattr(_packed_linear, "MIN_WEIGHT", {torch.float32: 0, torch.bfloat16: 0})
    tokenizer = AutoTokenizer.from_pretrained(family_dir)
    loaded = load_model(str(family_dir), dtype="bfloat16", device="cpu")
    names = {name.rsplit(".", 1)[-1] for name, _ in loaded.model.named_modules()}
    grouped = any(MEMBER in vars(module) for module in loaded.model.modules())
    assert grouped == (packing == "every-layer" and bool({"q_proj", "gate_proj"} & names))
    if not is_batch_invariant(loaded.model):
        # Only models on transformers' SDPA attention are switched; the rest keep theirs.
        assert loaded.model.config._attn_implementation != "sdpa"
        pytest.skip(f"attention {loaded.model.config._attn_implementation!r} is not switched")
    engine = TorchEngine(
        loaded.model,
        tokenizer,
        eos_token_ids=[],
        context_length=2048,
        max_batch_size=16,
    )
    engine.start()
    try:
        suffixes = {name.rsplit(".", 1)[-1] for name in engine.adaptable_modules}
        targets = [n for n in ("q_proj", "v_proj", "o_proj", "qkv_proj") if n in suffixes]
        lora = {"r": 4, "alpha": 8, "target_modules": targets}
        packed, padded = (LoraTrainer(engine, name, lora, seed=1) for name in ("packed", "padded"))
        padded.packs_prefixes = False
        sequences = await _samples(engine, tokenizer)
        assert engine.metrics.max_batch_size_seen == 9  # the joiner decoded beside the 8
        scores = [tinker_scores(trainer, sequences, engine) for trainer in (packed, padded)]
        rows, _ = pack_rows(sequences, max_length=4096, mask_truncated=False)
        settings = OptimizerSettings(learning_rate=1e-3, micro_batch_tokens=4096)
        metrics = packed.grpo_step(rows, loss_preset("grpo"), settings, beta=0.0)
    finally:
        engine.stop()
    for sequence, from_pack, from_padding in zip(sequences, *scores, strict=True):
        sampled = sequence.trained_mask[1:]
        expected = sequence.old_logprobs[1:][sampled]
        # Equal up to float32's rounding of the head's logits and log-softmax (a few 1e-7).
        assert torch.allclose(from_pack[sampled], expected, rtol=0, atol=2e-6)
        assert torch.allclose(from_padding[sampled], expected, rtol=0, atol=2e-6)
    assert metrics["ratio_mean"] == 1.0
    assert metrics["logprob_abs_diff"] < 1e-6
    assert metrics["grad_norm"] > 0


async def _samples(engine: TorchEngine, tokenizer) -> list[Sequence]:
    """Two groups of four, submitted together (one batch, rows of two prompt lengths), a
    request that joins them once they decode (its prompt's keys added beside theirs), then one
    request alone (a one-row batch)."""
    requests = [
        GenerationRequest(
            prompt_ids=prompt(tokenizer, words),
            params=SamplingParams(max_new_tokens=12, temperature=1.0, seed=group),
            n=4 if group < 2 else 1,
        )
        for group, words in enumerate((2, 9, 4, 5))
    ]
    sequences: list[Sequence] = []
    queues = [engine.submit(request) for request in requests[:2]]
    first = await queues[0].get()  # a token of the first group: the batch is decoding
    assert isinstance(first, TokenEvent)
    queues.append(engine.submit(requests[2]))
    for group, (request, queue) in enumerate(zip(requests[:3], queues, strict=True)):
        choices = await finished(queue, n=request.n)
        for index, choice in choices.items():
            sequences.append(
                sampled_sequence(request.prompt_ids, choice, group, advantage=index - 1.5)
            )
    alone = (await finished(engine.submit(requests[3])))[0]
    sequences.append(sampled_sequence(requests[3].prompt_ids, alone, 3, advantage=1.0))
    return sequences


def test_a_float32_model_keeps_its_attention(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    assert not make_batch_invariant(loaded.model)
    assert loaded.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("mask_kind", ["causal", "bool", "additive", "per_head"])
def test_float64_attention_is_attention(mask_kind: str) -> None:
    """The same values as SDPA in float64 for grouped-query heads and each kind of mask."""
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 2, 6, 2, 7, 8
    query = torch.randn(batch, heads, length, dim, generator=generator, dtype=torch.float64)
    key, value = (
        torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=torch.float64)
        for _ in range(2)
    )
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = allowed.expand(batch, 1, length, length).clone()
    allowed[1, :, :, :2] = False  # the second row is left-padded by two
    allowed[1, :, :2, 0] = True  # ... and its padding queries see one key (no empty row)
    mask: torch.Tensor | None
    if mask_kind == "causal":
        mask, reference_mask = None, None
    elif mask_kind == "bool":
        mask = reference_mask = allowed
    elif mask_kind == "additive":
        mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, -1e30)
        reference_mask = mask
    else:
        mask = reference_mask = allowed.expand(batch, heads, length, length)
    got = float64_attention(query, key, value, mask, dim**-0.5, causal=mask_kind == "causal")
    expected = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=reference_mask,
        is_causal=mask_kind == "causal",
        enable_gqa=True,
    )
    assert torch.allclose(got, expected, atol=1e-12)


def test_a_left_padded_row_attends_as_it_does_alone_bit_for_bit() -> None:
    """bf16 inputs: the row padded on the left by 5 keys gives the unpadded row's output."""
    generator = torch.Generator().manual_seed(1)
    length, pad, dim = 19, 5, 16
    query = torch.randn(1, 4, 1, dim, generator=generator).bfloat16()
    key, value = (torch.randn(1, 2, length, dim, generator=generator).bfloat16() for _ in range(2))
    alone = float64_attention(query, key, value, None, 0.25, causal=False)
    padding = torch.randn(1, 2, pad, dim, generator=generator).bfloat16()
    mask = torch.ones(1, 1, 1, pad + length, dtype=torch.bool)
    mask[..., :pad] = False
    padded = float64_attention(
        query,
        torch.cat([padding, key], dim=2),
        torch.cat([padding, value], dim=2),
        mask,
        0.25,
        causal=False,
    )
    assert torch.equal(alone, padded)


def test_the_switch_turns_it_off_and_a_wrong_value_is_refused_by_name(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_BATCH_INVARIANT", "off")
    loaded = load_model(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    assert not is_batch_invariant(loaded.model)
    assert loaded.model.config._attn_implementation == "sdpa"
    monkeypatch.setenv("ART_BATCH_INVARIANT", "sometimes")
    with pytest.raises(ModelLoadError, match="ART_BATCH_INVARIANT='sometimes'"):
        load_model(str(tiny_model_dir), dtype="bfloat16", device="cpu")


@pytest.mark.parametrize("layout", ["causal", "padded", "blocks"])
def test_its_gradient_is_the_exact_attentions(
    layout: str, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backward (`attention_gradients`, float32) gives the float64 autograd gradient of the
    same attention to bf16 rounding, for queries, keys and values: grouped heads, a causal
    triangle, a padded row that attends to nothing (zeros, not NaN), queries in blocks."""
    from art_backend.engines import _batch_invariant
    from art_backend.engines._batch_invariant import _attention

    module = load_model(str(tiny_model_dir), dtype="bfloat16").model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(2)
    shapes = [(2, 4, 6, 16), (2, 2, 6, 16), (2, 2, 6, 16)]
    inputs = [torch.randn(shape, generator=generator).bfloat16() for shape in shapes]
    upstream = torch.randn(2, 6, 4, 16, generator=generator).bfloat16()
    mask = None
    if layout == "padded":  # row 1 is two pad tokens then four real ones; pads see nothing
        mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
        mask[1, :, :, :2] = False
    if layout == "blocks":  # two queries a block
        monkeypatch.setattr(_batch_invariant, "BLOCK_BYTES", 2 * 2 * 4 * 6 * 4 * 3)
    leaves = [t.clone().requires_grad_() for t in inputs]
    output, _ = _attention(module, *leaves, mask, scaling=0.25)
    output.backward(upstream)
    exact = [t.double().requires_grad_() for t in inputs]
    grouped = exact[0].reshape(2, 2, 2 * 6, 16) @ exact[1].transpose(-1, -2) * 0.25
    scores = grouped.view(2, 2, 2, 6, 6)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril() if mask is None else mask.unsqueeze(2)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    reference = (probs.view(2, 2, 12, 6) @ exact[2]).view(2, 4, 6, 16).transpose(1, 2)
    reference.backward(upstream.double())
    for ours, theirs in zip(leaves, exact, strict=True):
        assert ours.grad is not None and theirs.grad is not None
        assert ours.grad.dtype == torch.bfloat16 and torch.isfinite(ours.grad).all()
        assert torch.allclose(ours.grad.double(), theirs.grad, rtol=1e-2, atol=1e-2)
    if layout == "padded":  # the pad queries get no gradient
        assert torch.equal(leaves[0].grad[1, :, :2], torch.zeros_like(leaves[0].grad[1, :, :2]))


def test_a_loras_one_row_decode_is_its_full_forward(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A served LoRA's layers run in float32 under the bf16 model: one row decoding through
    them scores as the whole sequence's forward does."""
    from transformers import DynamicCache

    from tests.support.adapters import make_random_adapter

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    loaded = load_model(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    engine = TorchEngine(loaded.model, tokenizer, eos_token_ids=[], context_length=2048)
    engine.load_adapter("agent@1", make_random_adapter(tiny_model_dir, tmp_path / "lora", seed=3))
    model = engine.model
    model.set_adapter(engine.adapters["agent@1"])
    tokens = torch.randint(5, len(tokenizer), (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        whole = torch.log_softmax(model(input_ids=tokens).logits[0, 19:-1].float(), dim=-1)
        cache = DynamicCache()
        model(input_ids=tokens[:, :19], cache=cache, use_cache=True)
        steps = [
            model(input_ids=tokens[:, i : i + 1], cache=cache, use_cache=True).logits
            for i in range(19, 39)
        ]
    decoded = torch.log_softmax(torch.cat(steps, dim=1)[0].float(), dim=-1)
    assert torch.allclose(decoded, whole, rtol=0, atol=2e-6)


@pytest.mark.parametrize("mask_kind", ["causal", "bool"])
def test_queries_in_blocks_attend_as_all_at_once(
    mask_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long prompt's queries go in blocks (bounded memory): bit for bit the same output."""
    from art_backend.engines import _batch_invariant

    generator = torch.Generator().manual_seed(5)
    query = torch.randn(2, 4, 37, 16, generator=generator).bfloat16()
    key, value = (torch.randn(2, 2, 37, 16, generator=generator).bfloat16() for _ in range(2))
    mask = torch.ones(37, 37, dtype=torch.bool).tril().expand(2, 1, 37, 37).clone()
    mask[1, :, :, :3] = False
    arguments = (None, 0.25, True) if mask_kind == "causal" else (mask, 0.25, False)
    whole = float64_attention(query, key, value, *arguments)
    monkeypatch.setattr(_batch_invariant, "BLOCK_BYTES", 2 * 4 * 37 * 16 * 5)  # 5 queries
    assert torch.equal(float64_attention(query, key, value, *arguments), whole)


def _recorded(
    monkeypatch: pytest.MonkeyPatch, name: str, size: Callable[[torch.Tensor, torch.Tensor], int]
) -> list[int]:
    """`_batch_invariant.<name>` (query and key first) wrapped: the list of `size(query, key)`
    of each call from here on."""
    from art_backend.engines import _batch_invariant

    sizes: list[int] = []
    real = getattr(_batch_invariant, name)

    def recorded(query: torch.Tensor, key: torch.Tensor, *rest: object) -> torch.Tensor:
        sizes.append(size(query, key))
        return real(query, key, *rest)

    monkeypatch.setattr(_batch_invariant, name, recorded)
    return sizes


@pytest.mark.parametrize("earlier_keys", [0, 12])
def test_causal_blocks_attend_over_the_keys_up_to_their_last_query_only(
    earlier_keys: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long unpadded prompt (causal, no mask) in blocks: each block computes over the keys up
    to its last query's (a 2,048-token prompt's attention took a third of the time), and gives
    the output of all keys bit for bit; its gradients to float32 rounding. With `earlier_keys`
    the prompt continues keys already cached (each query sees them all)."""
    from art_backend.engines import _batch_invariant
    from art_backend.engines._batch_invariant import attention_gradients

    queries, keys = 40, 40 + earlier_keys
    generator = torch.Generator().manual_seed(7)
    query = torch.randn(2, 4, queries, 16, generator=generator).bfloat16()
    key, value = (torch.randn(2, 2, keys, 16, generator=generator).bfloat16() for _ in range(2))
    upstream = torch.randn(2, 4, queries, 16, generator=generator).bfloat16()
    whole = float64_attention(query, key, value, None, 0.25, causal=True)
    whole_grads = attention_gradients(query, key, value, None, 0.25, True, upstream)
    widths = _recorded(monkeypatch, "_float64_block", lambda query, key: key.shape[2])
    monkeypatch.setattr(_batch_invariant, "SPARSE_QUERIES", 8)
    monkeypatch.setattr(_batch_invariant, "SPARSE_MIN_QUERIES", 16)
    assert torch.equal(float64_attention(query, key, value, None, 0.25, causal=True), whole)
    assert widths == [earlier_keys + end for end in range(8, queries + 1, 8)]
    grads = attention_gradients(query, key, value, None, 0.25, True, upstream)
    for ours, theirs in zip(grads, whole_grads, strict=True):
        assert torch.allclose(ours.float(), theirs.float(), rtol=0, atol=1e-2)


def test_a_decode_steps_rows_attend_in_chunks_as_all_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many rows over long keys (a decode step at a long context) go in chunks of rows whose
    float64 keys and values stay small: bit for bit the output of all rows at once, a row's
    own mask in its chunk."""
    from art_backend.engines import _batch_invariant

    generator = torch.Generator().manual_seed(8)
    query = torch.randn(5, 4, 1, 16, generator=generator).bfloat16()
    key, value = (torch.randn(5, 2, 30, 16, generator=generator).bfloat16() for _ in range(2))
    mask = torch.ones(5, 1, 1, 30, dtype=torch.bool)
    for row in range(5):
        mask[row, ..., : 3 * row] = False  # left padding, a different amount in each row
    whole = float64_attention(query, key, value, mask, 0.25, causal=False)
    chunks = _recorded(monkeypatch, "_float64_block", lambda query, key: query.shape[0])
    monkeypatch.setattr(_batch_invariant, "ROW_CHUNK_BYTES", 2 * 30 * 16 * 8 * 2 * 2)  # 2 rows
    assert torch.equal(float64_attention(query, key, value, mask, 0.25, causal=False), whole)
    assert chunks == [2, 2, 1]


def test_packed_queries_attend_over_the_keys_they_see_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed row (a prompt, then completions that see it and themselves, then padding that
    sees nothing): blocks of queries computed over the keys they attend to give the output of
    all keys bit for bit, and the gradients to float32 rounding."""
    from art_backend.engines import _batch_invariant
    from art_backend.engines._batch_invariant import _attended, attention_gradients

    prompt, completion, members, pad = 6, 8, 3, 4
    length = prompt + completion * members + pad
    allowed = torch.zeros(length, length, dtype=torch.bool)
    allowed[:prompt, :prompt] = torch.ones(prompt, prompt, dtype=torch.bool).tril()
    for member in range(members):
        start = prompt + member * completion
        rows = slice(start, start + completion)
        allowed[rows, :prompt] = True
        allowed[rows, rows] = torch.ones(completion, completion, dtype=torch.bool).tril()
    additive = torch.zeros(2, 1, length, length).masked_fill(~allowed, torch.finfo().min)
    mask = additive.bfloat16()
    generator = torch.Generator().manual_seed(6)
    query = torch.randn(2, 4, length, 16, generator=generator).bfloat16()
    key, value = (torch.randn(2, 2, length, 16, generator=generator).bfloat16() for _ in range(2))
    upstream = torch.randn(2, 4, length, 16, generator=generator).bfloat16()
    monkeypatch.setattr(_batch_invariant, "SPARSE_QUERIES", 8)
    monkeypatch.setattr(_batch_invariant, "SPARSE_MIN_QUERIES", 16)
    second = _attended(mask[..., prompt + 8 : prompt + 16, :])  # the prompt, then itself
    assert isinstance(second, torch.Tensor) and len(second) == prompt + 8
    assert _attended(mask[..., :prompt, :]) == slice(0, prompt)  # a run: a view
    assert len(_attended(mask[..., -pad:, :])) == 0
    sparse = float64_attention(query, key, value, mask, 0.25, causal=False)
    sparse_grads = attention_gradients(query, key, value, mask, 0.25, False, upstream)
    monkeypatch.setattr(_batch_invariant, "SPARSE_SHARE", -1.0)  # every block over all keys
    assert torch.equal(sparse, float64_attention(query, key, value, mask, 0.25, causal=False))
    assert torch.equal(sparse[..., -pad:, :], torch.zeros_like(sparse[..., -pad:, :]))
    dense_grads = attention_gradients(query, key, value, mask, 0.25, False, upstream)
    for ours, theirs in zip(sparse_grads, dense_grads, strict=True):
        assert torch.allclose(ours.float(), theirs.float(), rtol=0, atol=1e-2)


def test_a_sliding_layers_decode_step_attends_over_its_window_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decode step of a sliding-window layer over left-padded rows of different lengths: its
    keys narrowed to the windows' columns (views) give the output of all keys bit for bit; a
    mask whose attended columns are not one run (slots ending apart) keeps every key."""
    from types import SimpleNamespace

    from art_backend.engines import _batch_invariant

    keys, window = 40, 8
    generator = torch.Generator().manual_seed(7)
    query = torch.randn(3, 4, 1, 16, generator=generator).bfloat16()
    key, value = (torch.randn(3, 2, keys, 16, generator=generator).bfloat16() for _ in range(2))
    left_padded = torch.zeros(3, 1, 1, keys, dtype=torch.bool)
    for row, length in enumerate((40, 25, 5)):  # a row shorter than the window too
        left_padded[row, ..., keys - min(length, window) :] = True
    slots = torch.zeros(3, 1, 1, keys, dtype=torch.bool)  # rows from column 0, ending apart
    for row, length in enumerate((10, 30, 40)):
        slots[row, ..., length - window : length] = True
    seen = _recorded(monkeypatch, "float64_attention", lambda query, key: key.shape[2])
    sliding = SimpleNamespace(sliding_window=window, is_causal=True, training=False)
    full = SimpleNamespace(sliding_window=None, is_causal=True, training=False)
    for mask, narrowed_to in ((left_padded, window), (slots, keys)):
        seen.clear()
        narrowed, _ = _batch_invariant._attention(sliding, query, key, value, mask, scaling=0.25)
        whole, _ = _batch_invariant._attention(full, query, key, value, mask, scaling=0.25)
        assert seen == [narrowed_to, keys]
        assert torch.equal(narrowed, whole)


class _Layers(torch.nn.Module):
    """Linear layers of SmolLM2's shapes (bf16) and of a LoRA's (float32), switched as a
    batch-invariant model's are."""

    def __init__(self) -> None:
        super().__init__()
        from types import SimpleNamespace

        from art_backend.engines._batch_invariant import ATTENTION

        generator = torch.Generator().manual_seed(6)
        shapes = [(576, 1536, torch.bfloat16), (1536, 576, torch.bfloat16)]
        shapes += [(576, 192, torch.bfloat16), (576, 16, torch.float32)]
        self.layers = torch.nn.ModuleList()
        for in_features, out_features, dtype in shapes:
            layer = torch.nn.Linear(in_features, out_features, bias=False, dtype=dtype)
            weight = torch.randn(out_features, in_features, generator=generator) * 0.05
            layer.weight.data.copy_(weight)
            self.layers.append(layer)
        self.config = SimpleNamespace(_attn_implementation=ATTENTION)


def test_a_linear_rows_values_do_not_depend_on_the_rows_beside_it() -> None:
    """A row's output is the same bits whatever number of rows share the call: one alone (a
    one-row decode), 16 or 33 (a decode step), 41 to 600 (a trainer's forward). On an Intel Xeon
    with AMX oneDNN's bf16 kernels change with the row count from 33 rows up, and before the
    row ceiling a decode step and the trainer's forward differed here."""
    from art_backend.engines._packed_linear import pack_linear_layers

    model = _Layers()
    floor_linear_rows(model)  # as loading does: the floor first, then packing
    assert pack_linear_layers(model) == 3  # the bf16 ones (a LoRA's stay dense)
    generator = torch.Generator().manual_seed(7)
    for layer in model.layers:
        x = torch.randn(600, layer.in_features, generator=generator).to(layer.weight.dtype)
        with torch.inference_mode():
            alone = torch.cat([layer(x[i : i + 1]) for i in range(600)])
            for rows in (2, 16, 17, 32, 33, 41, 64, 77, 100, 300, 513, 600):
                assert torch.equal(layer(x[:rows]), alone[:rows]), (layer, rows)
            batched = layer(x[:510].reshape(10, 51, -1))
        assert torch.equal(batched.reshape(510, -1), alone[:510])


def test_a_blocked_linears_gradients_are_the_dense_ones() -> None:
    """Past the ceiling the forward runs in blocks; the backward is the dense layer's: the
    input's, the weight's where it trains (a LoRA's), a bias's."""
    generator = torch.Generator().manual_seed(8)
    model = _Layers()
    model.layers.append(torch.nn.Linear(16, 576, dtype=torch.float32))
    floor_linear_rows(model)
    for layer in (model.layers[3], model.layers[4], model.layers[1]):
        trains = layer.weight.dtype == torch.float32
        layer.requires_grad_(trains)
        x = torch.randn(3, 70, layer.in_features, generator=generator).to(layer.weight.dtype)
        ours, theirs = x.clone().requires_grad_(), x.clone().double().requires_grad_()
        upstream = torch.randn(3, 70, layer.out_features, generator=generator)
        layer(ours).backward(upstream.to(layer.weight.dtype))
        ours_grads = [p.grad.clone() for p in layer.parameters() if p.requires_grad]
        layer.zero_grad()
        weight = layer.weight.detach().double().requires_grad_(trains)
        bias = None if layer.bias is None else layer.bias.detach().double().requires_grad_()
        torch.nn.functional.linear(theirs, weight, bias).backward(upstream.double())
        tolerance = 1e-4 if trains else 2e-2
        assert torch.allclose(ours.grad.double(), theirs.grad, rtol=tolerance, atol=tolerance)
        theirs_grads = [t.grad for t in (weight, bias) if t is not None and t.requires_grad]
        assert len(ours_grads) == len(theirs_grads) == (2 if layer.bias is not None else 1) * trains
        for got, expected in zip(ours_grads, theirs_grads, strict=True):
            assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-4)
