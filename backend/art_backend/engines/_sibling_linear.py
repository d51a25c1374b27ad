"""Packed linear layers that read one input tensor, run as one call: q/k/v, gate/up.

A decoder layer's attention calls its q, k and v projections on the same hidden state, its MLP
its gate and up projections; packed (`_packed_linear`), each is a oneDNN call of its own, and at
a decode step's few rows a call costs more than its weight's bytes (SmolLM2's k and v, 192x576:
41 us each inside a 16-row bf16 step, against 99 us for q's 576x576). One call on the weights
stacked along the output dimension computes the same sums: each output column is the same dot
product over the same input, and oneDNN's result for a column does not depend on the columns
beside it (checked bit for bit on SmolLM2's layers, float32 at 2-1,000 rows, bf16 at 2-69 rows;
bf16 calls of 300 rows or more take AMX kernels whose q/k/v sums differ, and the batch-invariant
model never makes a call past `ROW_CEILING` rows). So the sampler's logprobs stay the trainer's,
and both run the grouped call.

`group_siblings` groups, under one parent module, the packed layers named as one of
`SIBLING_NAMES` (all of a set present, one input width, dtype and device, biases on all or
none) and drops nothing: each member keeps its module, weight and name (PEFT wraps it as
before). The first member called on an input runs the group's call and keeps the output for the
others; one output is kept per thread, the others' columns copied out as each member is
called, so a long prompt's activations live no longer than its q/k/v or gate/up calls. A member
called on another input, or with its weight training, another dtype, or the group changed,
computes the group's call again or runs as a layer of its own: never a stale value. The group's
packed weight is packed again when any member's weight is replaced or changed in place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from art_backend.engines._packed_linear import (
    input_gradient,
    is_packed,
    linear,
    pack_weight,
    run_packed,
)

SIBLING_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Where grouping paid (`benchmarks/sibling_linear.py`, SmolLM2, 2-core Xeon with AMX): bf16,
# whose row floors make every call 32 rows or fewer, 0.95x a decode step and 0.97x a training
# step; in float32 1.01x and 1.02x (a trainer's calls are whole there, and the members' copies
# cost what the calls saved), so float32 layers stay a call each.
GROUPED_DTYPES = (torch.bfloat16,)
MEMBER = "_art_sibling"  # a member's (group, index) in its module's __dict__
Kernel = Callable[[torch.Tensor], torch.Tensor]  # rows -> the group's outputs for them
Full = Callable[[Kernel, torch.Tensor], torch.Tensor]  # (kernel, input) -> the group's output
Packed = tuple[list["WeightKey"], Kernel]  # the members' weights packed, and the call on them
_kept = threading.local()  # `_Kept`: the last group output on this thread


def group_siblings(model: Any) -> int:
    """Group `model`'s packed sibling layers (module docstring); returns how many groups. Call it
    after `pack_linear_layers` and before adapters are added. Idempotent."""
    groups = 0
    for parent in model.modules():
        children = parent._modules
        for names in SIBLING_NAMES:
            layers = [children.get(name) for name in names]
            if _groupable(layers) and not any(MEMBER in vars(layer) for layer in layers):
                group = SiblingGroup(layers)  # type: ignore[arg-type]
                for index, layer in enumerate(layers):
                    vars(layer)[MEMBER] = (group, index)
                    if getattr(vars(layer).get("forward"), "__func__", None) is linear:
                        layer.forward = _member_forward.__get__(layer)  # type: ignore[method-assign]
                groups += 1
    return groups


def _groupable(layers: list[Any]) -> bool:
    if not all(type(layer) is nn.Linear and is_packed(layer) for layer in layers):
        return False
    first = layers[0].weight
    if first.dtype not in GROUPED_DTYPES:
        return False
    return all(
        layer.in_features == layers[0].in_features
        and layer.weight.dtype == first.dtype
        and layer.weight.device == first.device
        and (layer.bias is None) == (layers[0].bias is None)
        for layer in layers
    )


class SiblingGroup:
    """The member layers, their columns in the group's output, and the packed stacked weight."""

    def __init__(self, members: list[nn.Linear]) -> None:
        self.members = members
        bounds, start = [], 0
        for layer in members:
            bounds.append((start, start + layer.out_features))
            start += layer.out_features
        self.bounds = bounds
        # The members' weights as last packed and the call on them, set in one assignment: a
        # thread reading it sees the old pair or the new one, never a key beside another call.
        self.packed: Packed | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> SiblingGroup:
        import copy

        # A copy of the model (a replica) gets a group of its own members, packed anew (the
        # members may be half copied here: nothing of theirs is read).
        twin = SiblingGroup.__new__(SiblingGroup)
        twin.members = [copy.deepcopy(layer, memo) for layer in self.members]
        twin.bounds, twin.packed = list(self.bounds), None
        return twin

    def kernel(self, x: torch.Tensor) -> Packed | None:
        """The group's one call on rows of `x` with the weights it reads, or None where a member
        must run alone: another dtype or device than the weights', a weight or bias that trains
        under autograd."""
        if x.device.type != "cpu":
            return None
        grad = torch.is_grad_enabled()
        for layer in self.members:
            for tensor in (layer.weight, layer.bias):
                if tensor is not None and (
                    tensor.dtype != x.dtype
                    or tensor.device.type != "cpu"
                    or (grad and tensor.requires_grad)
                ):
                    return None
        key = [_weight_key(layer) for layer in self.members]
        state = self.packed
        return state if state is not None and state[0] == key else self._pack(key)

    def _pack(self, key: list[WeightKey]) -> Packed | None:
        with torch.inference_mode(False), torch.no_grad():
            packed = pack_weight(torch.cat([layer.weight.detach() for layer in self.members]))
            if packed is None:
                return None
            biases = [layer.bias for layer in self.members]
            bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])  # type: ignore[union-attr]
        state: Packed = (key, lambda rows: run_packed(rows, packed, bias))
        self.packed = state
        return state


class _Kept:
    """A group's output on `input`, the members yet to take their part, and the members'
    weights it was computed with (`_weight_key`): a member whose weight changed since runs
    anew."""

    __slots__ = ("group", "input", "left", "output", "weights")

    def __init__(
        self, group: SiblingGroup, x: torch.Tensor, output: torch.Tensor, weights: list[WeightKey]
    ) -> None:
        self.group, self.input, self.output, self.weights = group, x, output, weights
        self.left = set(range(len(group.members)))

    def serves(self, group: SiblingGroup, index: int, x: torch.Tensor) -> bool:
        return (
            self.group is group
            and self.input is x
            and index in self.left
            and self.weights[index] == _weight_key(group.members[index])
        )


WeightKey = tuple[int, int, int, int]


def _weight_key(layer: nn.Linear) -> WeightKey:
    """A layer's weight and bias by storage and version: changed in place or replaced, it differs."""
    weight, bias = layer.weight, layer.bias
    if bias is None:
        return weight.data_ptr(), weight._version, 0, 0
    return weight.data_ptr(), weight._version, bias.data_ptr(), bias._version


def sibling_output(module: nn.Module, x: torch.Tensor, full: Full) -> torch.Tensor | None:
    """`module`'s output on `x` from its group's one call (`full(kernel, x)`, the group's
    output), or None where `module` has no group or must run alone."""
    entry = vars(module).get(MEMBER)
    if entry is None or torch.compiler.is_compiling():
        return None  # traced into a compiled step: a packed layer of its own (`_compiled_step`)
    group, index = entry
    if torch.is_grad_enabled() and x.requires_grad:
        packed = group.kernel(x)
        if packed is None:
            return None
        return _SiblingLinear.apply(x, module.weight, group, index, packed, full)
    return _take(group, index, x, full)


def _take(
    group: SiblingGroup, index: int, x: torch.Tensor, full: Full, packed: Packed | None = None
) -> torch.Tensor | None:
    """Member `index`'s columns of the group's output on `x`: the kept one where this thread's
    last group call was this group's on `x` with the member's weight as it is, else a new call
    (`packed`, or the group's, None where the member must run alone), the rest kept for the
    others (one output kept a thread: the last one is dropped before the call)."""
    kept = getattr(_kept, "last", None)
    if kept is not None and kept.serves(group, index, x):
        return _part(kept, index)
    packed = packed if packed is not None else group.kernel(x)
    if packed is None:
        return None
    _kept.last = None
    weights, kernel = packed
    kept = _Kept(group, x, full(kernel, x), weights)
    _kept.last = kept
    return _part(kept, index)


def _part(kept: _Kept, index: int) -> torch.Tensor:
    kept.left.discard(index)
    if not kept.left:
        _kept.last = None
    start, stop = kept.group.bounds[index]
    return kept.output[..., start:stop].contiguous()


def _member_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A grouped packed layer's forward (one without a row floor)."""
    grouped = sibling_output(self, x, _whole)
    return grouped if grouped is not None else linear(self, x)


def _whole(kernel: Kernel, x: torch.Tensor) -> torch.Tensor:
    return kernel(x)


class _SiblingLinear(torch.autograd.Function):
    """Forward: a member's columns of the group's call. Backward: the input's gradient through
    the member's own dense weight (the weights of a grouped call never train)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        group: SiblingGroup,
        index: int,
        packed: Packed,
        full: Full,
    ) -> torch.Tensor:
        ctx.save_for_backward(weight)
        output = _take(group, index, x, full, packed)
        assert output is not None  # `packed` given: a call is made
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        return input_gradient(grad, weight), None, None, None, None, None
