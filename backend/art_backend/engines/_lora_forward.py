"""Served LoRA layers without PEFT's per-call work: the same operations, so the same values.

PEFT's `lora.Linear.forward` checks its arguments, walks its adapter dicts through
`nn.Module.__call__` (dropout, A and B are modules of their own) and adds the adapter's output
in three operations (scale, add, cast back). On a decode step's few rows those calls are
most of a LoRA layer's time: an adapter on SmolLM2's seven projections (210 layers) made a
16-row bf16 step 47 % slower than the base model's (88-92 ms against 60, 2 threads of a Xeon,
2026-12-06); rollouts run through the adapter after the first step.

`lean_lora_forward` runs, where no gradient is taken (the engine's decode and prefill), the
operations PEFT runs and nothing else: the base layer, the input cast to the adapter's dtype
(once for the layers that share an input, q/k/v and gate/up; only a cast of up to
`SHARED_CAST_ELEMENTS` values is kept for the next layer, never a long prompt's), A's and B's own forwards (their
row floor and packing, as the trainer runs them), and the scaled sum, cast back to the base's
dtype, into the base's output in one `torch.add` (`out=`: computed in float32, rounded once, as
PEFT's add and cast are). The scale goes through `alpha` only when it is a power of two of at
least 1: then `alpha * u` is exact and a fused multiply-add rounds as PEFT's separate multiply
and add do; any other scale is multiplied first, as PEFT does. So the sampler's logprobs stay
the trainer's bit for bit (tested against PEFT's forward). Anything else (gradients, several
active adapters, `adapter_names`, DoRA or another variant, dropout in training mode, merged or
disabled adapters, hooks on the base layer, a compiled step's trace) runs PEFT's own forward.
"""

from __future__ import annotations

import math
import threading
import types
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.nn.modules import module as _modules_hooks

from art_backend.engines._batch_invariant import one_call
from art_backend.engines._packed_linear import is_packed

_shared = threading.local()  # (input, its cast): the last input cast on this thread
SHARED_CAST_ELEMENTS = 2**20  # the largest cast kept for the next layer (4 MB in float32)


def lean_lora_forward(model: Any) -> None:
    """Give every plain PEFT `lora.Linear` of `model` the lean forward; idempotent."""
    from peft.tuners.lora.layer import Linear

    for module in model.modules():
        if type(module) is Linear and "forward" not in vars(module):
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]


def _forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    # Traced into a compiled step (`_compiled_step.py`), PEFT's forward: the per-call work
    # this saves is gone from a compiled graph, and its `out=` sum into a view came out wrong.
    plain = not (args or kwargs or torch.is_grad_enabled() or torch.compiler.is_compiling())
    adapter = _plain_adapter(self) if plain else None
    if adapter is None:
        return type(self).forward(self, x, *args, **kwargs)
    lora_a, lora_b, scaling = adapter
    result = _call(self.base_layer, x)
    if result.dtype not in _ADDS_INTO or not result.is_contiguous():
        return type(self).forward(self, x)  # not a base layer of ours: PEFT's sum
    width = x.shape[-1]
    flat_input = _cast(x.reshape(-1, width), x, lora_a.weight.dtype)
    update = _dense(lora_b, _dense(lora_a, flat_input))
    flat = result.view(-1, result.shape[-1])
    if scaling == 1.0:
        torch.add(flat, update, out=flat)
    elif _exact_alpha(scaling) and update.dtype != torch.float16:  # float16: its own overflow
        torch.add(flat, update, alpha=scaling, out=flat)
    else:
        torch.add(flat, update.mul_(scaling), out=flat)
    return result


_ADDS_INTO = (torch.float32, torch.bfloat16, torch.float16)


def _plain_adapter(self: Any) -> tuple[nn.Linear, nn.Linear, float] | None:
    """The one active vanilla LoRA adapter's A, B and scale, or None (PEFT's forward then).
    Read from the layer's own attributes: PEFT's properties and `Module.__getattr__` cost
    more than the rest of the layer's Python."""
    state = vars(self)
    if state["_disable_adapters"] or state["merged_adapters"] or state["lora_variant"]:
        return None
    if not state.get("cast_input_dtype_enabled", True):
        return None
    active = state["_active_adapter"]
    modules = state["_modules"]
    lora_a = modules["lora_A"]._modules
    names = [active] if isinstance(active, str) else [name for name in active if name in lora_a]
    if len(names) != 1 or names[0] not in lora_a:
        return None
    name = names[0]
    dropout = modules["lora_dropout"]._modules[name]
    if dropout.training and type(dropout) is not nn.Identity:
        return None
    return lora_a[name], modules["lora_B"]._modules[name], float(state["scaling"][name])


def _call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module(x)`; its `forward` directly where no hook would run (`__call__`'s few
    microseconds, three times a layer, 210 layers a step)."""
    return module(x) if _call_hooks(module) else module.forward(x)


def _dense(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A LoRA layer (never packed) on `x`: one dense call where its row floor would make one."""
    if one_call(x) and not is_packed(layer) and not _call_hooks(layer):
        return functional.linear(x, layer.weight, layer.bias)
    return layer(x)


def _call_hooks(module: nn.Module) -> bool:
    """Whether `module(x)` would run a forward hook (its own or a global one)."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or _modules_hooks._global_forward_hooks
        or _modules_hooks._global_forward_pre_hooks
    )


def _exact_alpha(scaling: float) -> bool:
    """A power of two of at least 1: scaling a float32 by it is exact (no rounding, no underflow)."""
    mantissa, exponent = math.frexp(scaling)
    return mantissa == 0.5 and exponent >= 1


def _cast(flat: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`flat` in `dtype`: the cast made for the same input tensor just before (the model's q, k
    and v projections, or gate and up, are called with one tensor), else a new one."""
    if flat.dtype == dtype:
        return flat
    last = getattr(_shared, "last", None)
    if last is not None and last[0] is x and last[1].dtype == dtype:
        return last[1]
    cast = flat.to(dtype)
    # Kept until the next cast on this thread: only a small one (a decode step's), never a
    # long prompt's activations.
    _shared.last = (x, cast) if flat.numel() <= SHARED_CAST_ELEMENTS else None
    return cast
