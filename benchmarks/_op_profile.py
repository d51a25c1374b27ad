"""Where a step's time goes (torch.profiler, ops grouped into buckets) and what it computes
(FLOPs counted by torch's FlopCounterMode, CPU attention included).

Buckets, in the order an op is assigned:

1. by scope: an op inside a `scoped` call or a hooked module (`bench:sampling`, `bench:lora`,
   `bench:loss`, `bench:optimizer`, `bench:rows`), or a backward op whose autograd node was made
   by such an op (the profiler's sequence numbers tie a backward node to its forward op);
2. by name: matmul, attention, copies (copy, cat, index, clone, allocation), views (view,
   reshape, slice, transpose: shape-only ops, their cost is dispatch), elementwise (the rest:
   norms, RoPE, SiLU, masks, embedding);
3. python: the step's wall time not inside any op or scope (Python between ops, the
   profiler's own cost). Python inside a scope (the rows' text and stop checks) is the scope's.

Shares are of the profiled wall time; an op's time is its self CPU time (children excluded), on
the calling thread (OpenMP workers run inside their op).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.autograd.profiler import record_function

SCOPE_PREFIX = "bench:"
MATMUL_OPS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "aten::_addmm_activation", "aten::addmv", "aten::mv", "aten::dot",
}  # fmt: skip
COPY_OPS = {
    "aten::copy_", "aten::cat", "aten::index", "aten::index_select", "aten::index_put_",
    "aten::_index_put_impl_", "aten::clone", "aten::contiguous", "aten::to", "aten::_to_copy",
    "aten::stack", "aten::repeat", "aten::empty", "aten::empty_like", "aten::empty_strided",
    "aten::zeros", "aten::zeros_like", "aten::ones", "aten::ones_like", "aten::full",
    "aten::new_zeros", "aten::new_empty", "aten::new_ones", "aten::fill_", "aten::zero_",
    "aten::resize_", "aten::pad", "aten::constant_pad_nd",
}  # fmt: skip
VIEW_OPS = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::slice", "aten::select",
    "aten::transpose", "aten::t", "aten::permute", "aten::unsqueeze", "aten::squeeze",
    "aten::as_strided", "aten::expand", "aten::expand_as", "aten::narrow", "aten::split",
    "aten::chunk", "aten::unbind", "aten::alias", "aten::_unsafe_view", "aten::detach",
    "detach", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::flatten",
    "aten::unflatten", "aten::view_as", "aten::split_with_sizes", "aten::movedim",
}  # fmt: skip
BUCKETS = (
    "matmul", "attention", "lora", "sampling", "rows", "loss", "optimizer", "copies", "views",
    "elementwise", "python",
)  # fmt: skip


def scoped(function: Callable[..., Any], label: str) -> Callable[..., Any]:
    """`function`, each call inside the profiler scope `bench:<label>`."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(SCOPE_PREFIX + label):
            return function(*args, **kwargs)

    return wrapper


def scope_modules(modules: list[torch.nn.Module], label: str) -> None:
    """Run each module's forward inside the profiler scope `bench:<label>` (forward hooks)."""
    for module in modules:
        open_scopes: list[Any] = []

        def enter(_module: Any, _inputs: Any, opened: list[Any] = open_scopes) -> None:
            scope = record_function(SCOPE_PREFIX + label)
            scope.__enter__()
            opened.append(scope)

        def leave(_m: Any, _i: Any, _o: Any, opened: list[Any] = open_scopes) -> None:
            opened.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)


def lora_modules(model: Any) -> list[torch.nn.Module]:
    """The LoRA A and B matrices of a PEFT model (empty for a plain model)."""
    found: list[torch.nn.Module] = []
    for module in model.modules():
        for part in ("lora_A", "lora_B"):
            found.extend(getattr(module, part, {}).values() if hasattr(module, part) else [])
    return found


@contextlib.contextmanager
def profiled(steps: int) -> Iterator[dict[str, Any]]:
    """Profile the block (`steps` steps of it); the dict then holds `buckets` (seconds and share
    of the wall time, per step) and `top_ops` (the 20 ops with the most self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    report: dict[str, Any] = {}
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        started = time.perf_counter()
        yield report
        wall = time.perf_counter() - started
    report.update(summarise(profiler, wall, steps))


def summarise(profiler: Any, wall: float, steps: int) -> dict[str, Any]:
    """Buckets and the top-20 op table of a finished profile of `steps` steps over `wall` s."""
    events = [e for e in profiler.events() if not getattr(e, "is_async", False)]
    backward_scopes = _forward_scopes_by_sequence(events)
    seconds = dict.fromkeys(BUCKETS, 0.0)
    covered = 0.0
    for event in events:
        own = event.self_cpu_time_total / 1e6
        covered += own
        seconds[_bucket(event, backward_scopes)] += own
    seconds["python"] += max(wall - covered, 0.0)  # outside every op and scope
    table = profiler.key_averages()
    ranked = sorted(table, key=lambda row: row.self_cpu_time_total, reverse=True)
    ranked = [row for row in ranked if not row.key.startswith(SCOPE_PREFIX)][:20]
    return {
        "steps": steps,
        "wall_s_per_step": round(wall / steps, 5),
        "buckets": {
            name: {"s_per_step": round(value / steps, 5), "share": round(value / wall, 4)}
            for name, value in seconds.items()
        },
        "top_ops": [
            {
                "op": row.key,
                "calls_per_step": round(row.count / steps, 1),
                "self_cpu_ms_per_step": round(row.self_cpu_time_total / 1e3 / steps, 3),
                "share": round(row.self_cpu_time_total / 1e6 / wall, 4),
            }
            for row in ranked
        ],
    }


def _scope_of(event: Any) -> str | None:
    """The innermost `bench:` scope above `event`, if any."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(SCOPE_PREFIX):
            return parent.name[len(SCOPE_PREFIX) :]
        parent = parent.cpu_parent
    return None


def _forward_scopes_by_sequence(events: list[Any]) -> dict[int, str]:
    """Autograd sequence number -> the scope of the forward op that made the node."""
    scopes: dict[int, str] = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::"):
            scope = _scope_of(event)
            if scope is not None:
                scopes.setdefault(event.sequence_nr, scope)
    return scopes


def _bucket(event: Any, backward_scopes: dict[int, str]) -> str:
    if event.name.startswith(SCOPE_PREFIX):  # its self time: Python inside the scope
        return event.name[len(SCOPE_PREFIX) :]
    scope = _scope_of(event)
    if scope is not None:
        return scope
    node = event
    while node is not None:  # a backward op: the scope of its node's forward op
        if node.name.startswith("autograd::engine::evaluate_function"):
            if node.sequence_nr in backward_scopes:
                return backward_scopes[node.sequence_nr]
            break
        node = node.cpu_parent
    name = event.name
    if getattr(event, "is_user_annotation", False):
        return "python"  # an annotation's self time is Python between its ops
    if _under_attention(event):
        return "attention"
    if name in MATMUL_OPS or "mkldnn" in name:
        return "matmul"
    if name in COPY_OPS:
        return "copies"
    if name in VIEW_OPS:
        return "views"
    return "elementwise"


def _under_attention(event: Any) -> bool:
    """An SDPA kernel, or an op it runs (its math fallback's matmuls and softmax)."""
    node = event
    while node is not None:
        if "scaled_dot_product" in node.name or "flash_attention" in node.name:
            return True
        node = node.cpu_parent
    return False


@contextlib.contextmanager
def counting_flops() -> Iterator[Any]:
    """FlopCounterMode over the block, CPU flash attention counted as its CUDA twins are, and
    oneDNN's packed linear (`_packed_linear`) as the matmul it is (FlopCounterMode has no
    formula for it: uncounted, a packed step looked half as heavy)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten

    def forward(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
        return flop_counter.sdpa_flop_count(query, key, value)

    def backward(grad: Any, query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
        return flop_counter.sdpa_backward_flop_count(grad, query, key, value)

    def packed_linear(x: Any, weight: Any, *_: Any, **__: Any) -> int:
        return 2 * math.prod(x[:-1]) * x[-1] * weight[0]

    mapping = {  # these receive shapes (FlopCounterMode wraps them)
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
        torch.ops.mkldnn._linear_pointwise: packed_linear,
    }
    with flop_counter.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        yield counter


def flops_by_kind(counter: Any) -> dict[str, int]:
    """A finished counter's FLOPs: `total`, and `attention` (the SDPA kernels' part)."""
    counts = counter.get_flop_counts().get("Global", {})
    attention = sum(v for op, v in counts.items() if "scaled_dot_product" in str(op))
    return {"total": int(counter.get_total_flops()), "attention": int(attention)}
