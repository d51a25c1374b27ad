"""Packed layers that read one input run as one call (`_sibling_linear`): each member's values
and gradient are its own layer's, a changed weight or another input is never served stale, a
copy groups its own layers, and what cannot be grouped runs alone."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch import nn

from art_backend.engines import _packed_linear, _sibling_linear
from art_backend.engines._batch_invariant import ATTENTION, floor_linear_rows
from art_backend.engines._packed_linear import pack_linear_layers, packing_available
from art_backend.engines._sibling_linear import MEMBER, group_siblings

pytestmark = [
    pytest.mark.torch_engine,
    pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN packed linear"),
]


class _Attention(nn.Module):
    def __init__(self, width: int = 96, bias: bool = False) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, width, bias=bias)
        self.k_proj = nn.Linear(width, 32, bias=bias)
        self.v_proj = nn.Linear(width, 32, bias=bias)
        self.o_proj = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.q_proj(x)) + torch.cat([self.k_proj(x), self.v_proj(x)], -1).sum(
            -1, keepdim=True
        )


def _pair(
    dtype: torch.dtype, floored: bool, monkeypatch: pytest.MonkeyPatch, bias: bool = False
) -> tuple[_Attention, _Attention]:
    """A grouped model and its ungrouped twin (the same weights), both packed, floored or not.
    float32 layers are grouped here too (not by default, where it did not pay): the same code."""
    _sibling_linear._kept.last = None
    monkeypatch.setattr(_packed_linear, "MIN_WEIGHT", {torch.float32: 0, torch.bfloat16: 0})
    monkeypatch.setattr(_sibling_linear, "GROUPED_DTYPES", (torch.bfloat16, torch.float32))
    torch.manual_seed(0)
    models = []
    for grouped in (True, False):
        torch.manual_seed(0)
        model = _Attention(bias=bias).to(dtype).requires_grad_(False)
        if floored:  # as `make_batch_invariant` leaves a bf16 model's layers
            model.config = types.SimpleNamespace(_attn_implementation=ATTENTION)  # type: ignore[assignment]
            floor_linear_rows(model)
        assert pack_linear_layers(model) == 4
        if grouped:
            assert group_siblings(model) == 1
        models.append(model)
    return models[0], models[1]


@pytest.mark.parametrize(
    ("dtype", "floored"),
    [(torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)],
    ids=["float32", "bf16-row-floor", "bf16"],
)
@pytest.mark.parametrize("rows", [1, 2, 7, 40])
def test_each_member_gives_its_own_layers_values_bit_for_bit(
    dtype: torch.dtype, floored: bool, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    grouped, alone = _pair(dtype, floored, monkeypatch, bias=rows == 7)
    assert MEMBER in vars(grouped.k_proj) and MEMBER not in vars(grouped.o_proj)
    x = torch.randn(rows, 3, 96, generator=torch.Generator().manual_seed(rows)).to(dtype)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            got, expected = getattr(grouped, name)(x), getattr(alone, name)(x)
            assert got.is_contiguous() and torch.equal(got, expected), name
        assert _sibling_linear._kept.last is None  # every member took its part: nothing kept
        group = vars(grouped.q_proj)[MEMBER][0]
        assert group.packed is not None  # one call, all three members' columns
        assert group.packed[1](x.reshape(-1, 96)).shape[-1] == 96 + 32 + 32
        assert torch.equal(grouped(x), alone(x))


@pytest.mark.parametrize("floored", [False, True], ids=["float32", "bf16-row-floor"])
def test_the_input_gradient_is_each_layers_own(
    floored: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = torch.bfloat16 if floored else torch.float32
    grouped, alone = _pair(dtype, floored, monkeypatch)
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(2)).to(dtype)
    grads = []
    for model in (grouped, alone):
        leaf = x.clone().requires_grad_(True)
        model(leaf).float().square().sum().backward()
        grads.append(leaf.grad)
    assert grads[0] is not None and torch.equal(grads[0], grads[1])


def test_a_changed_weight_or_another_input_is_never_served_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grouped, alone = _pair(torch.float32, False, monkeypatch)
    x, y = torch.randn(2, 4, 96, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        grouped.q_proj(x)
        assert torch.equal(grouped.k_proj(y), alone.k_proj(y))  # another input: a new call
        assert torch.equal(grouped.v_proj(x), alone.v_proj(x))
        for model in (grouped, alone):
            model.k_proj.weight.mul_(2)  # in place: packed again
        assert torch.equal(grouped.k_proj(x), alone.k_proj(x))
        for model in (grouped, alone):
            model.v_proj.weight = nn.Parameter(torch.ones(32, 96), requires_grad=False)
        assert torch.equal(grouped.v_proj(x), alone.v_proj(x))


def test_a_deep_copy_groups_its_own_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    grouped, _ = _pair(torch.float32, False, monkeypatch)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = grouped.k_proj(x)
        twin = copy.deepcopy(grouped)
        group, twin_group = vars(grouped.k_proj)[MEMBER][0], vars(twin.k_proj)[MEMBER][0]
        assert twin_group is not group and twin_group.members[1] is twin.k_proj
        assert twin_group.packed is None  # packs its own at its first call
        grouped.k_proj.weight.zero_()
        assert torch.equal(twin.k_proj(x), before)


def test_what_cannot_be_grouped_runs_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_packed_linear, "MIN_WEIGHT", {torch.float32: 0, torch.bfloat16: 0})
    _sibling_linear._kept.last = None
    float32 = _Attention()
    pack_linear_layers(float32)
    assert group_siblings(float32) == 0  # float32 layers: a call each, by default
    monkeypatch.setattr(_sibling_linear, "GROUPED_DTYPES", (torch.bfloat16, torch.float32))
    model = _Attention()
    model.v_proj = nn.Linear(64, 32)  # another input width
    mlp = nn.Module()
    mlp.gate_proj, mlp.up_proj = nn.Linear(96, 64), nn.Linear(96, 64)
    holder = nn.ModuleList([model, mlp])
    pack_linear_layers(holder)
    assert group_siblings(holder) == 1  # gate/up; not q/k/v
    assert MEMBER not in vars(model.q_proj) and MEMBER in vars(mlp.up_proj)
    assert group_siblings(holder) == 0  # idempotent
    # A weight that trains under autograd runs as a layer of its own, and gets its gradient.
    x = torch.randn(3, 96)
    mlp.up_proj(x).sum().backward()
    assert mlp.up_proj.weight.grad is not None and mlp.gate_proj.weight.grad is None
    assert _sibling_linear._kept.last is None
