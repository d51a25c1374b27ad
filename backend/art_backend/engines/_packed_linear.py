"""Linear layers on a CPU through oneDNN with their weights packed once, not torch's dense path.

On a CPU `nn.Linear` runs MKL's sgemm in float32 and oneDNN with a plain weight in bf16. For a
decode step's few rows neither reads the weights near the memory's speed: here (2 threads of an
AMD EPYC, 24 GB/s summed over a tensor) the 16-row float32 LM head of SmolLM2 read its 113 MB at
4.6 GB/s. oneDNN with the weight reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's freezing packs) ran every linear
shape of SmolLM2 faster, measured quiet on 2026-12-06: at 16 rows the layers of one decode step
took 8.1 ms instead of 25.6 in float32 and 4.5 instead of 9.1 in bf16 (the LM head 7.6 against
24.6 ms float32), at 64 rows 20.6 against 42.0 and 12.2 against 17.8; at a training step's 258-336
rows 1.1-1.6x faster.

- **Same values.** In bf16 the packed result equals the dense one bit for bit. In float32 it is
  oneDNN's own sums, ~1e-4 from MKL's, and a row's result is the same whatever the row count from
  2 up (checked 2 to 300 rows on every SmolLM2 shape): a one-row call runs padded to two, so the
  sampler's one-row decode and the trainer's full forward sum alike.
- **Training.** The engine and the trainer share the model, so the trainer's forward runs the
  same packed kernels (its logprobs are the sampler's); the backward of a packed layer is the
  input's gradient, `grad @ weight`, dense. Only frozen weights run packed: a layer whose weight
  wants a gradient runs dense, and only the layers marked at load (the base model's) are
  packed, never a LoRA adapter's.
- **Invalidation.** A weight is packed at its layer's first call and again whenever it is
  replaced or changed in place (its storage or version differs).
- **Memory.** The packed copy lives beside the dense weight (the backward and PEFT read the
  dense one): the linear weights twice.

`ART_PACKED_LINEAR=0` (or false/no/off) keeps torch's dense layers; a GPU never packs.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from art_backend.engines._switches import env_switch

VARIABLE = "ART_PACKED_LINEAR"
ROWS_HINT = 64  # the row count oneDNN's layout is chosen for (any count runs on it)
ROW_FLOOR = 2  # one row takes another kernel than two or more (float32, K=1536)
# The smallest weight packing pays for, by dtype: below it torch's dense call is as fast or
# faster (16 rows, 2 threads: float32 64x64 7.7 against 22.5 us, 256x256 23.9 against 33.6,
# 512x256 44.3 against 43.1; bf16 64x64 19.8 against 21.7, 256x256 27.8 against 25.7).
MIN_WEIGHT = {torch.float32: 512 * 256, torch.bfloat16: 256 * 256}  # and the dtypes packed
CAST_ROWS = 128  # rows of a gradient cast to the weight's dtype at a time (backward)
_UNMARKED = object()


def packing_available() -> bool:
    """Whether this torch has oneDNN's packed linear on the CPU."""
    mkldnn = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


def packing_on() -> bool:
    """`ART_PACKED_LINEAR` on (the default) and oneDNN's packed linear in this torch."""
    return env_switch(VARIABLE, default=True) and packing_available()


def pack_linear_layers(model: Any) -> int:
    """Mark every plain `nn.Linear` of `model` on the CPU in float32 or bf16, of at least
    `MIN_WEIGHT` weights, to run packed (`ART_PACKED_LINEAR`, on by default); returns how many.
    Call it before adapters are added: their layers stay dense. A layer whose forward is already
    replaced (the float32 LM head, a row floor) keeps it; those call `linear` themselves."""
    if not packing_on():
        return 0
    marked = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is not nn.Linear or weight is None:
            continue
        smallest = MIN_WEIGHT.get(weight.dtype)  # None: a dtype never packed
        if weight.device.type != "cpu" or smallest is None or weight.numel() < smallest:
            continue
        vars(module)["_art_packed"] = _PackedCache()  # packed at the first call
        if "forward" not in vars(module):
            module.forward = types.MethodType(linear, module)  # type: ignore[method-assign]
        marked += 1
    return marked


def is_packed(module: Any) -> bool:
    """Whether `pack_linear_layers` marked `module`."""
    return "_art_packed" in vars(module)


def linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`module`'s linear layer on `x`: packed if `pack_linear_layers` marked it, else dense."""
    weight, bias = module.weight, module.bias
    packed = _packed_for(module, x, weight, bias)
    if packed is None:
        return functional.linear(x, weight, bias)
    if torch.is_grad_enabled() and x.requires_grad:
        return _PackedLinear.apply(x, weight, packed, bias)
    return run_packed(x, packed, bias)


def row_kernel(module: nn.Linear, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """What `linear(module, x)` runs without autograd, decided once: for many calls on blocks
    of `x`'s rows (contiguous, `ROW_FLOOR` rows or more each)."""
    weight, bias = module.weight, module.bias
    packed = _packed_for(module, x, weight, bias)
    if packed is None:
        return lambda rows: functional.linear(rows, weight, bias)
    return lambda rows: run_packed(rows, packed, bias)


def _packed_for(
    module: nn.Linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """`module`'s packed weight for `x` (packed now if new or changed); None: run it dense.
    Inside a compiled step the pack is the one `refresh_packs` made before the step (a storage
    pointer cannot be read while tracing)."""
    cached = vars(module).get("_art_packed", _UNMARKED)
    if torch.compiler.is_compiling():
        return None if cached is _UNMARKED or x.dtype != weight.dtype else cached.packed
    trains = weight.requires_grad or (bias is not None and bias.requires_grad)
    if (
        cached is _UNMARKED
        or x.dtype != weight.dtype
        or x.device.type != "cpu"
        or (trains and torch.is_grad_enabled())  # a weight or bias that trains: dense
    ):
        return None
    return cached.current(weight)


def refresh_packs(model: Any) -> None:
    """Pack every marked layer of `model` whose weight is new or changed since its last pack, as
    its next eager call would: what a compiled step (`_compiled_step.py`) reads is current."""
    for module in model.modules():
        cached = vars(module).get("_art_packed")
        if cached is not None:
            cached.current(module.weight)


class _PackedCache:
    """A layer's packed weight and the (storage, version) of the weight it was packed from.
    A deep copy of the layer (a replica's weights) starts empty: the copy packs its own."""

    __slots__ = ("key", "packed")

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.packed: torch.Tensor | None = None

    def current(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The pack of `weight`, packed again if it was replaced or changed in place since;
        None where it cannot be packed (run it dense)."""
        key = (weight.data_ptr(), weight._version)
        if self.key != key:
            self.key, self.packed = key, pack_weight(weight)
        return self.packed

    def __deepcopy__(self, memo: dict[int, Any]) -> _PackedCache:
        return _PackedCache()


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` reordered for oneDNN's linear; None where it cannot be (device, dtype, torch)."""
    if weight.device.type != "cpu" or weight.dtype not in MIN_WEIGHT:
        return None
    if not packing_available():
        return None
    # Outside inference mode even when the first call is the engine's: the trainer's forward
    # reads the same packed tensor.
    with torch.inference_mode(False), torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, weight: torch.Tensor
) -> torch.Tensor:
    """x @ W.T + bias through `packed` (`pack_weight(W)`); the gradient of `x` (never of the
    frozen W) through the dense `weight`, W or a copy of it in another dtype (the backward runs
    in its dtype). Another dtype or device than the packed weight's runs dense."""
    if x.dtype != packed.dtype or x.device.type != "cpu" or x.shape[-1] != packed.shape[1]:
        return functional.linear(x, packed.to_dense().to(x.device, x.dtype), bias)
    if torch.is_grad_enabled() and x.requires_grad:
        return _PackedLinear.apply(x, weight, packed, bias)
    return run_packed(x, packed, bias)


def run_packed(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T + bias through `packed` (`pack_weight(W)`), no autograd; fewer rows than
    `ROW_FLOOR` run padded to it."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0:
        return x.new_zeros((*x.shape[:-1], packed.shape[0]))
    if rows < ROW_FLOOR:
        padded = x.new_zeros((ROW_FLOOR, x.shape[-1]))
        padded[:rows] = x.reshape(rows, -1)
        out = _pointwise(padded, packed, bias)[:rows]
        return out.reshape(*x.shape[:-1], out.shape[-1])
    return _pointwise(x.contiguous(), packed, bias)


def _pointwise(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's packed linear; inside a compiled step through `art::packed_linear`, an op
    inductor calls as it is (it lowers `mkldnn._linear_pointwise` only for weights it packed)."""
    if torch.compiler.is_compiling():
        return packed_linear_op(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@torch.library.custom_op("art::packed_linear", mutates_args=())
def packed_linear_op(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`mkldnn._linear_pointwise` as an op of ours: what a compiled step's graph calls."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear_op.register_fake
def _packed_linear_shape(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


class _PackedLinear(torch.autograd.Function):
    """Forward: the packed kernel. Backward: the input's gradient only (frozen weights), in the
    dense weight's dtype (autograd casts it to the input's)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        packed: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return run_packed(x, packed, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        return input_gradient(grad, weight), None, None, None


def input_gradient(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The input's gradient of a frozen linear layer, `grad @ weight`, in the weight's dtype."""
    if grad.dtype == weight.dtype:
        return grad @ weight
    # Cast a block of rows at a time: the float32 LM head's gradient [positions, vocabulary]
    # cast whole would be one more tensor of its size (100 MB on a GRPO step of SmolLM2).
    flat = grad.reshape(-1, grad.shape[-1])
    result = flat.new_empty((flat.shape[0], weight.shape[1]), dtype=weight.dtype)
    for start in range(0, flat.shape[0], CAST_ROWS):
        result[start : start + CAST_ROWS] = (
            flat[start : start + CAST_ROWS].to(weight.dtype) @ weight
        )
    return result.view(*grad.shape[:-1], weight.shape[1])
