"""oneDNN's packed linear layers (`_packed_linear`): the values, the rows, the gradient, a
changed weight, the adapters left dense, and the switch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer

from art_backend._errors import ModelLoadError
from art_backend.engines._loading import load_model
from art_backend.engines._packed_linear import is_packed, pack_linear_layers, packing_available
from art_backend.testing import TorchEngine

pytestmark = [
    pytest.mark.torch_engine,
    pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN packed linear"),
]


def _layers(dtype: torch.dtype) -> tuple[nn.Linear, nn.Linear]:
    """A packed layer and its dense twin (the same weight and bias)."""
    torch.manual_seed(0)
    dense = nn.Linear(1536, 160).to(dtype).requires_grad_(False)
    packed = nn.Linear(1536, 160).to(dtype).requires_grad_(False)
    packed.load_state_dict(dense.state_dict())
    holder = nn.Sequential(packed)
    assert pack_linear_layers(holder) == 1 and is_packed(packed)
    return packed, dense


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_packed_layer_is_the_dense_one_and_a_row_sums_alike_in_any_batch(
    dtype: torch.dtype,
) -> None:
    """bf16: the dense result bit for bit. float32: oneDNN's sums, within 1e-4 of MKL's. Either way a
    row's result is the same alone (one row, padded to two) as among 2, 5 or 64 rows."""
    packed, dense = _layers(dtype)
    x = torch.randn(64, 1536, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        got = packed(x)
        if dtype == torch.bfloat16:
            assert torch.equal(got, dense(x))
        else:
            assert torch.allclose(got, dense(x), atol=1e-4)
        assert packed._art_packed.packed is not None  # the packed kernel ran
        for rows in (1, 2, 5):
            assert torch.equal(packed(x[:rows]), got[:rows])
        assert torch.equal(packed(x.view(4, 16, 1536))[1], got[16:32])  # any leading shape


def test_a_small_layer_stays_dense() -> None:
    """Below `MIN_WEIGHT` torch's dense call is as fast or faster: not marked."""
    small = nn.Sequential(nn.Linear(64, 64), nn.Linear(256, 256).bfloat16())
    assert pack_linear_layers(small) == 1
    assert not is_packed(small[0]) and is_packed(small[1])


def test_the_gradient_reaches_the_input_and_a_trained_weight_runs_dense() -> None:
    packed, dense = _layers(torch.float32)
    x = torch.randn(8, 1536, generator=torch.Generator().manual_seed(2))
    leaves = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    upstream = torch.randn(8, 160, generator=torch.Generator().manual_seed(3))
    packed(leaves[0]).backward(upstream)
    dense(leaves[1]).backward(upstream)
    assert leaves[0].grad is not None and leaves[1].grad is not None
    assert torch.allclose(leaves[0].grad, leaves[1].grad, atol=1e-5)
    packed.weight.requires_grad_(True)  # a weight that trains gets its gradient (dense path)
    packed(x).sum().backward()
    assert packed.weight.grad is not None and packed.weight.grad.abs().sum() > 0


def test_a_deep_copy_packs_its_own_weight() -> None:
    """A replica's copy of the model (`copy.deepcopy`) runs packed on its own weights."""
    import copy

    packed, _ = _layers(torch.float32)
    x = torch.randn(4, 1536, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = packed(x)
        twin = copy.deepcopy(packed)
        twin.weight.mul_(2)
        assert torch.equal(packed(x), before) and is_packed(twin)
        assert torch.allclose(
            twin(x), torch.nn.functional.linear(x, twin.weight, twin.bias), atol=1e-4
        )


def test_a_changed_weight_is_packed_again() -> None:
    packed, dense = _layers(torch.bfloat16)
    x = torch.randn(4, 1536, generator=torch.Generator().manual_seed(4)).bfloat16()
    with torch.no_grad():
        before = packed(x)
        for layer in (packed, dense):
            layer.weight.mul_(2)  # in place: the same storage, a new version
        assert torch.equal(packed(x), dense(x)) and not torch.equal(packed(x), before)
        packed.weight = nn.Parameter(torch.zeros_like(packed.weight), requires_grad=False)
        assert torch.equal(packed(x), packed.bias.expand(4, -1))  # replaced: packed again


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_loaded_model_packs_its_base_layers_and_leaves_adapters_dense(
    dtype: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_backend.engines import _packed_linear
    from tests.support.adapters import make_random_adapter

    # the tiny model's layers are small: every size packs
    monkeypatch.setattr(_packed_linear, "MIN_WEIGHT", {torch.float32: 0, torch.bfloat16: 0})
    loaded = load_model(str(tiny_model_dir), dtype=dtype, device="cpu")
    base = [m for m in loaded.model.modules() if type(m) is nn.Linear]
    assert base and all(is_packed(m) for m in base)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = TorchEngine(loaded.model, tokenizer, eos_token_ids=[], context_length=512)
    engine.load_adapter("agent@1", make_random_adapter(tiny_model_dir, tmp_path / "lora", seed=3))
    adapter_layers = [
        module
        for name, module in engine.model.named_modules()
        if type(module) is nn.Linear and ".lora_" in name
    ]
    assert adapter_layers and not any(is_packed(m) for m in adapter_layers)
    wrapped = [m.base_layer for m in engine.model.modules() if hasattr(m, "base_layer")]
    assert wrapped and all(is_packed(m) for m in wrapped)


def test_the_switch_keeps_dense_layers_and_a_wrong_value_is_refused_by_name(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_PACKED_LINEAR", "off")
    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    assert not any(is_packed(m) for m in loaded.model.modules())
    monkeypatch.setenv("ART_PACKED_LINEAR", "fast")
    with pytest.raises(ModelLoadError, match="ART_PACKED_LINEAR='fast'"):
        load_model(str(tiny_model_dir), dtype="float32", device="cpu")
