"""A served LoRA layer's lean forward gives PEFT's values bit for bit (`_lora_forward`).

The engine's decode runs the adapter's layers without PEFT's per-call work; the trainer runs
PEFT's forward (under autograd). The sampler's logprobs are the trainer's only if both sum
alike, so the model's logits through the lean layers must equal PEFT's exactly, not closely:
float32 and bf16 (batch-invariant, its base layers packed), every scale kind (1, a power of two
through `alpha`, others multiplied first), one row to past the bf16 ceiling. The lean path must
really run (counted), and what it does not handle must go to PEFT.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from art_backend.engines._batch_invariant import floor_linear_rows, is_batch_invariant
from art_backend.engines._loading import load_model
from art_backend.engines._lora_forward import lean_lora_forward
from art_backend.engines._packed_linear import is_packed
from tests.support.tiny_model import build_tiny_model

pytestmark = pytest.mark.torch_engine

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 256 wide: bf16's packed base layers (`MIN_WEIGHT`) run under the adapter.
    return build_tiny_model(tmp_path_factory.mktemp("lora-forward"), hidden_size=256)


@pytest.fixture
def peft_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times PEFT's own `lora.Linear.forward` ran."""
    from peft.tuners.lora.layer import Linear

    calls = [0]
    original = Linear.forward

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Linear, "forward", counted)
    yield calls


def _adapted(model_dir: Path, dtype: str, alpha: float, **options) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    model = load_model(str(model_dir), dtype=dtype, device="cpu").model
    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=alpha, target_modules=TARGETS, init_lora_weights=False, **options
    )
    model = get_peft_model(model, config).eval()
    floor_linear_rows(model)  # as the engine's `load_adapter` does, before the lean forward
    return model


def _logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, **kwargs).logits


def _peft_only(model: torch.nn.Module) -> None:
    for module in model.modules():
        if hasattr(module, "lora_A"):
            vars(module).pop("forward", None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("alpha", [4, 8, 3, 2], ids=["scale1", "scale2", "scale0.75", "scale0.5"])
def test_the_lean_forward_gives_pefts_logits_bit_for_bit(
    model_dir: Path, dtype: str, alpha: float, peft_calls: list[int]
) -> None:
    model = _adapted(model_dir, dtype, alpha)
    if dtype == "bfloat16":
        assert is_batch_invariant(model)
        assert is_packed(model.base_model.model.model.layers[0].self_attn.q_proj.base_layer)
    lean_lora_forward(model)
    generator = torch.Generator().manual_seed(1)
    shapes = [(1, 1), (16, 1), (1, 5), (2, 20), (3, 33)]  # rows 1, 16, 5, 40 and 99
    batches = [torch.randint(0, 384, shape, generator=generator) for shape in shapes]
    lean = [_logits(model, ids) for ids in batches]
    assert peft_calls[0] == 0  # every layer took the lean path
    _peft_only(model)
    for ids, ours in zip(batches, lean, strict=True):
        assert torch.equal(ours, _logits(model, ids)), tuple(ids.shape)
    assert peft_calls[0] > 0
    # The adapter changes the logits: the comparison is not between two base models.
    with model.disable_adapter():
        assert not torch.equal(lean[-1], _logits(model, batches[-1]))


def test_what_the_lean_forward_does_not_handle_goes_to_peft(
    model_dir: Path, peft_calls: list[int]
) -> None:
    model = _adapted(model_dir, "bfloat16", 8, lora_dropout=0.5)
    model.add_adapter("other", model.peft_config["default"])
    floor_linear_rows(model)
    lean_lora_forward(model)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    layers = 7 * 2  # two decoder layers, seven adapted projections each

    with model.disable_adapter():
        _logits(model, ids)
    assert peft_calls[0] == layers
    _logits(model, ids.expand(2, -1), adapter_names=["default", "other"])  # a mixed batch
    assert peft_calls[0] == 2 * layers
    model.base_model.set_adapter(["default", "other"])  # two active adapters
    _logits(model, ids)
    assert peft_calls[0] == 3 * layers
    model.base_model.set_adapter("default")
    model.train()  # dropout in training mode, even without gradients
    _logits(model, ids)
    assert peft_calls[0] == 4 * layers
    model.eval()
    with torch.enable_grad():  # the trainer's forward
        model(input_ids=ids).logits.sum().backward()
    assert peft_calls[0] == 5 * layers
    _logits(model, ids)
    assert peft_calls[0] == 5 * layers  # and back on the lean path


def test_a_dora_adapter_runs_pefts_forward(model_dir: Path, peft_calls: list[int]) -> None:
    model = _adapted(model_dir, "float32", 8, use_dora=True)
    lean_lora_forward(model)
    _logits(model, torch.tensor([[3, 1, 4]]))
    assert peft_calls[0] == 7 * 2


def test_layers_sharing_an_input_share_its_cast_and_a_large_one_is_not_kept() -> None:
    from art_backend.engines import _lora_forward

    x = torch.randn(16, 1, 8, dtype=torch.bfloat16)
    first = _lora_forward._cast(x.reshape(-1, 8), x, torch.float32)
    assert _lora_forward._cast(x.reshape(-1, 8), x, torch.float32) is first  # k after q
    assert torch.equal(first, x.reshape(-1, 8).float())
    other = x.clone()  # equal values, another tensor: its own cast
    assert _lora_forward._cast(other.reshape(-1, 8), other, torch.float32) is not first
    large = torch.randn(_lora_forward.SHARED_CAST_ELEMENTS + 1, 1, dtype=torch.bfloat16)
    _lora_forward._cast(large.reshape(-1, 1), large, torch.float32)
    assert _lora_forward._shared.last is None  # not held until the next layer's call
