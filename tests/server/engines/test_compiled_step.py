"""The compiled decode step (`ART_DECODE_STEP=compiled`): the static step through torch.compile.

On the tiny Llama (grouped query heads, every linear layer packed): greedy tokens equal
`generate()` through the compiled graph; a base weight changed in place (packed anew) and an
adapter's new weights loaded into a retired adapter's layers both reach the compiled step (the
graph reads them as inputs, not constants); a batch mixing adapters runs eager, and so does a
shape past the most it compiles; compile seconds are counted. In bf16 as served without the
batch-invariant attention (float32 head, grouped q/k/v) the step compiles without a graph
break; with that attention it is refused at start, by name. Each compile costs seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from art_backend._errors import ModelLoadError
from art_backend.engines import _compiled_step, _packed_linear
from art_backend.engines._batch_invariant import make_batch_invariant
from art_backend.engines._step_shapes import StepShape
from art_backend.testing import TorchEngine
from tests.server.engines.test_architectures import finished, generate_alone, greedy, prompt
from tests.server.engines.test_static_step import LLAMA
from tests.support.adapters import load_model, make_random_adapter
from tests.support.tiny_families import build_family_model

pytestmark = pytest.mark.torch_engine


@pytest.fixture(autouse=True)
def compiled_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ART_DECODE_STEP", "compiled")
    # The tiny layers packed too (below MIN_WEIGHT they stay dense): the packs' refresh tested.
    monkeypatch.setattr(_packed_linear, "MIN_WEIGHT", {torch.float32: 0, torch.bfloat16: 0})


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(LLAMA, tmp_path_factory.mktemp("llama"))


def packed_model(folder: Path):
    model = load_model(folder)
    assert _packed_linear.pack_linear_layers(model) > 0
    return model


async def test_new_weights_and_adapters_reach_the_compiled_step_and_mixed_batches_run_eager(
    llama_dir: Path, tmp_path: Path
):
    from peft import PeftModel

    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    first_adapter = make_random_adapter(llama_dir, tmp_path / "a", seed=3)
    second_adapter = make_random_adapter(llama_dir, tmp_path / "b", seed=4)
    ids = prompt(tokenizer, 4)
    reference = load_model(llama_dir)
    engine = TorchEngine(packed_model(llama_dir), tokenizer, eos_token_ids=[], context_length=2048)
    engine.start()
    assert engine._compiled is not None
    recursion_limit, compiled = sys.getrecursionlimit(), engine._compiled._function

    def compiling(*args, **kwargs):  # as inductor's compile does (on a cold cache only)
        sys.setrecursionlimit(recursion_limit + 1000)
        return compiled(*args, **kwargs)

    engine._compiled._function = compiling
    try:
        before = (await finished(engine.submit(greedy(ids, 12))))[0].token_ids
        # The step put it back: the server's JSON parse relies on Python's own.
        assert sys.getrecursionlimit() == recursion_limit
        assert before == generate_alone(reference, ids, 12)
        with engine.exclusive() as model, torch.no_grad():  # a packed weight, in place
            model.model.layers[0].mlp.down_proj.weight.mul_(-2.0)
        reference.model.layers[0].mlp.down_proj.weight.data.mul_(-2.0)
        after = (await finished(engine.submit(greedy(ids, 12))))[0].token_ids
        assert after == generate_alone(reference, ids, 12) != before

        adapted = []
        for served, folder in (("agent@1", first_adapter), ("agent@2", second_adapter)):
            engine.load_adapter(served, folder)
            request = greedy(ids, 12)
            request.adapter = served
            adapted.append((await finished(engine.submit(request)))[0].token_ids)
            engine.unload_adapter(served)  # its layers retire: agent@2 is loaded into them
        for tokens, folder in zip(adapted, (first_adapter, second_adapter), strict=True):
            peft_model = PeftModel.from_pretrained(reference, str(folder)).eval()
            assert tokens == generate_alone(peft_model, ids, 12)
            reference = peft_model.unload()
        assert adapted[0] != adapted[1]

        engine.load_adapter("agent@3", first_adapter)  # a batch through two adapters: eager
        through_adapter = greedy(ids, 6)
        through_adapter.adapter = "agent@3"
        eager_before = engine._compiled.counters.eager_steps
        mixed = [engine.submit(greedy(ids, 6)), engine.submit(through_adapter)]
        mixed_tokens = [(await finished(events))[0].token_ids for events in mixed]
        counters = engine._compiled.counters
    finally:
        engine.stop()
    assert mixed_tokens[0] == after[:6] and mixed_tokens[1] == adapted[0][:6]
    assert counters.eager_steps > eager_before
    assert counters.compiled_steps == engine.metrics.decode_compiled_steps_total > 0
    assert engine.metrics.decode_compile_seconds_total > 0
    assert all(shape == StepShape(1, 128, True) for shape, _ in counters.shapes)


async def test_a_shape_past_the_most_it_compiles_runs_eager(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(_compiled_step, "MAX_SHAPES", 1)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    ids = prompt(tokenizer, 3)
    engine = TorchEngine(packed_model(llama_dir), tokenizer, eos_token_ids=[], context_length=2048)
    engine.start()
    try:
        alone = (await finished(engine.submit(greedy(ids, 4))))[0].token_ids  # 1 x 128: compiled
        pair = await finished(engine.submit(greedy(ids, 4, n=2)), n=2)  # 2 x 128: eager
        counters = engine._compiled.counters
    finally:
        engine.stop()
    assert (
        alone
        == pair[0].token_ids
        == pair[1].token_ids
        == generate_alone(load_model(llama_dir), ids, 4)
    )
    assert [shape for shape, _ in counters.shapes] == [StepShape(1, 128, True)]
    assert counters.compiled_steps == 3 and counters.eager_steps == 3


async def test_a_bf16_step_as_served_compiles_whole_and_reads_a_changed_head(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """bf16 without the batch-invariant attention: the float32 LM head and q/k/v, gate/up
    grouped (`_sibling_linear`) trace without a graph break; a head weight changed in place
    reaches the compiled step (its logprobs are the eager step's, to bf16's rounding)."""
    from torch._dynamo.utils import counters

    from art_backend.engines._float32_logits import compute_logits_in_float32
    from art_backend.engines._sibling_linear import group_siblings

    monkeypatch.setenv("ART_BATCH_INVARIANT", "0")
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    ids = prompt(tokenizer, 4)
    answers = {}
    for layout in ("static", "compiled"):
        monkeypatch.setenv("ART_DECODE_STEP", layout)
        model = load_model(llama_dir).to(torch.bfloat16)
        compute_logits_in_float32(model)
        _packed_linear.pack_linear_layers(model)
        assert group_siblings(model) > 0
        engine = TorchEngine(model, tokenizer, eos_token_ids=[], context_length=2048)
        engine.start()
        counters.clear()
        try:
            await finished(engine.submit(greedy(ids, 3)))
            with engine.exclusive() as held, torch.no_grad():
                held.get_output_embeddings().weight.mul_(3.0)
            answers[layout] = (await finished(engine.submit(greedy(ids, 3))))[0]
        finally:
            engine.stop()
        if layout == "compiled":
            assert engine._compiled.counters.compiled_steps == 4
            assert sum(counters["graph_break"].values()) == 0
    eager, compiled = answers["static"], answers["compiled"]
    assert compiled.token_ids[:2] == eager.token_ids[:2]
    assert compiled.logprobs[1] == pytest.approx(eager.logprobs[1], abs=0.05)


def test_it_is_refused_with_the_batch_invariant_attention_by_name(llama_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    model = load_model(llama_dir).to(torch.bfloat16)
    assert make_batch_invariant(model)
    engine = TorchEngine(model, tokenizer, eos_token_ids=[], context_length=64)
    with pytest.raises(ModelLoadError, match=r"ART_DECODE_STEP=compiled.*ART_BATCH_INVARIANT=0"):
        engine.start()
