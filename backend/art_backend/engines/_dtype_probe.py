"""`--dtype auto` on a CPU with native bf16 instructions: time this model's work, keep the faster.

Native bf16 is not faster everywhere: a GRPO step took 8.33 s in bf16 against 6.48 s in float32
on an Intel Xeon with AVX512-BF16 and no AMX, 3.5 s against 5.8 s on an AMD EPYC with
AVX512-BF16. So before the weights load, the loader times `F.linear` on random values at the
model's nn.Linear shapes (read from a meta-device skeleton; most of a step's arithmetic), each
distinct (in_features, out_features) once, weighted by its count:
    decode: a forward of DECODE_ROWS rows without grad (one decode step of a batch of sequences);
    train:  forward + backward w.r.t. the input of TRAIN_ROWS rows, the weight frozen (LoRA).
A GRPO step decodes each token it trains on and trains on it once, so per dtype it compares
    seconds per token = sum over shapes of count x (decode / DECODE_ROWS + train / TRAIN_ROWS)
and keeps bfloat16 under BF16_MARGIN x float32's figure (float32 is exact; the margin covers
noise). Weights past MAX_IN_FEATURES / MAX_WEIGHT_ELEMENTS are sliced, their time scaled back;
after a warm-up round per dtype, rounds alternate float32 and bfloat16 within BUDGET_SECONDS (at
most MAX_ROUNDS); each dtype's fastest round counts (noise only ever adds time).

Not timed: attention, norms, activations, weights streaming from memory (hot cache: leans to
float32). A real decoder layer's call (position embeddings, caches, masks) varies by version.
Cache: `dtype.json` in the caller's cache root, an entry per CPU model name, bf16 flags, torch
version, torch threads and Linear shapes; missing, corrupt or unwritable: measured again. Processes
starting together (torchrun's ranks) measure in turn under a lock and share the first answer.
Other work on the CPUs torch uses stalls its threads (a 2-core EPYC busy with a benchmark timed
bf16 1.9x faster or 2x slower by the run): when other processes used more than the CPUs torch
leaves free over a 0.25 s sample (/proc/stat), nothing is measured or cached and the rule stands.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from art_backend.engines._threads import foreign_cores

logger = logging.getLogger("art_backend.loading")

CACHE_FILE_NAME = "dtype.json"
CACHE_FORMAT = 1
CACHE_ENTRIES = 32  # the newest kept: one per model and thread count seen on this machine
LOCK_TIMEOUT_SECONDS = 120.0
DECODE_ROWS = 16
TRAIN_ROWS = 256
BF16_MARGIN = 0.9
BUDGET_SECONDS = 1.0
MAX_ROUNDS = 3
MAX_IN_FEATURES = 4096
MAX_WEIGHT_ELEMENTS = 1 << 21  # 8 MiB of float32: SmolLM2's output head is sliced, no layer
MIN_OUT_FEATURES = 256
# The CPU flags that decide how fast bf16 is (x86 AVX2/AVX512/AMX, ARM bf16/SVE).
BF16_FLAGS = {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "bf16", "sve"}
Shapes = list[tuple[int, int, int]]  # (in_features, out_features, how many Linears have it)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype `auto` picked on this CPU, the seconds per token behind it (0: unmeasured), why."""

    dtype: torch.dtype
    float32_seconds: float
    bfloat16_seconds: float
    reason: str
    cached: bool


def choose_cpu_dtype(
    model: Any,
    *,
    cache_root: Path,
    rule: torch.dtype = torch.bfloat16,
    budget_seconds: float = BUDGET_SECONDS,
) -> DtypeChoice:
    """float32 or bfloat16 for `model` on this CPU: from `cache_root/dtype.json`, or timed; `rule`
    (what `auto` says unmeasured) when the machine is too busy to time anything."""
    shapes = linear_shapes(model)
    if not shapes:
        return DtypeChoice(torch.float32, 0.0, 0.0, "no nn.Linear layers to time", cached=False)
    key = machine_key(shapes)
    cache_file = cache_root / CACHE_FILE_NAME
    with _cache_lock(cache_file):
        found = next((e for e in _cache_entries(cache_file) if e["key"] == key), None)
        if found is not None:
            where = f"measured at an earlier start, cached in {cache_file}"
            seconds = found["float32_seconds"], found["bfloat16_seconds"]
            return _choice(*seconds, where=where, cached=True)
        busy = busy_reason()
        if busy is not None:
            reason = f"the rule (not measured: the machine is busy, {busy})"
            return DtypeChoice(rule, 0.0, 0.0, reason, cached=False)
        started = time.perf_counter()
        seconds = measure_linears(shapes, budget_seconds=budget_seconds)
        where = f"measured {time.perf_counter() - started:.1f} s"
        if _write_cache(cache_file, key, *seconds):
            where += f"; cached in {cache_file}"
    return _choice(*seconds, where=where, cached=False)


def pick_dtype(float32_seconds: float, bfloat16_seconds: float) -> torch.dtype:
    """bfloat16 only when clearly faster: under BF16_MARGIN x float32's seconds."""
    return torch.bfloat16 if bfloat16_seconds < BF16_MARGIN * float32_seconds else torch.float32


def busy_reason(window: float = 0.25) -> str | None:
    """Why timings now would mislead (other processes using more CPUs than torch leaves free,
    sampled over `window` seconds: the load average lags and counts this very process), or None."""
    cpus, threads = os.cpu_count() or 1, torch.get_num_threads()
    other = foreign_cores(window)
    if other is None:  # no /proc/stat: the load average, this process included
        other = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    busy = other > max(cpus - threads, 0) + 0.5
    return (
        f"other processes using {other:.1f} cores, torch on {threads} of {cpus}" if busy else None
    )


def linear_shapes(model: Any) -> Shapes:
    """The distinct nn.Linear shapes of `model` (output head included), each with its count."""
    counts: dict[tuple[int, int], int] = {}
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            shape = (module.in_features, module.out_features)
            counts[shape] = counts.get(shape, 0) + 1
    return sorted((in_features, out, count) for (in_features, out), count in counts.items())


def machine_key(shapes: Shapes) -> dict[str, Any]:
    """What the measurement depends on: CPU, its bf16 flags, torch, threads, the Linear shapes."""
    return {
        "cpu": cpu_name(),
        "flags": sorted(BF16_FLAGS & cpu_flags()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "linears": [list(shape) for shape in shapes],
    }


# --- the measurement -------------------------------------------------------------------------


@dataclass
class _Shape:
    """One Linear shape in one dtype; `scale` = count x (full weight size / sliced size)."""

    weight: torch.Tensor
    decode_input: torch.Tensor
    train_input: torch.Tensor
    train_grad: torch.Tensor
    scale: float


def measure_linears(
    shapes: Shapes, *, budget_seconds: float = BUDGET_SECONDS
) -> tuple[float, float]:
    """Seconds per token of the Linears' work in float32 and in bfloat16 (fastest round)."""
    generator = torch.Generator().manual_seed(0)  # the global RNG stays untouched
    float32, bfloat16 = zip(*(_prepared(*shape, generator) for shape in shapes), strict=True)
    started = time.perf_counter()
    for prepared in (float32, bfloat16):  # warm-up: oneDNN builds its kernels on first use
        _round(prepared)
    warm_up = time.perf_counter() - started
    rounds = max(1, min(MAX_ROUNDS, int((budget_seconds - warm_up) / max(warm_up, 1e-6))))
    # Alternating, so a slower moment of the machine hits both dtypes.
    timings = [(_round(float32), _round(bfloat16)) for _ in range(rounds)]
    return min(t[0] for t in timings), min(t[1] for t in timings)


def _prepared(
    in_features: int, out_features: int, count: int, generator: torch.Generator
) -> list[_Shape]:
    """The float32 and the bfloat16 version of one shape (sliced to the caps), same values."""
    kept_in = min(in_features, MAX_IN_FEATURES)
    kept_out = min(out_features, max(MIN_OUT_FEATURES, MAX_WEIGHT_ELEMENTS // kept_in))
    weight = torch.randn(kept_out, kept_in, generator=generator)
    decode = torch.randn(DECODE_ROWS, kept_in, generator=generator)
    train = torch.randn(TRAIN_ROWS, kept_in, generator=generator)
    grad = torch.randn(TRAIN_ROWS, kept_out, generator=generator)  # of the train output
    scale = count * (out_features * in_features) / (kept_out * kept_in)
    return [
        _Shape(weight.to(d), decode.to(d), train.to(d), grad.to(d), scale)
        for d in (torch.float32, torch.bfloat16)
    ]


def _round(shapes: tuple[_Shape, ...]) -> float:
    """Seconds per token, decode and train, summed over the shapes (count-weighted)."""
    total = 0.0
    for shape in shapes:
        started = time.perf_counter()
        with torch.no_grad():
            F.linear(shape.decode_input, shape.weight)
        decode = time.perf_counter() - started
        started = time.perf_counter()
        with torch.enable_grad():
            F.linear(shape.train_input.requires_grad_(), shape.weight).backward(shape.train_grad)
        train = time.perf_counter() - started
        shape.train_input.grad = None
        total += shape.scale * (decode / DECODE_ROWS + train / TRAIN_ROWS)
    return total


def _choice(float32: float, bfloat16: float, *, where: str, cached: bool) -> DtypeChoice:
    dtype = pick_dtype(float32, bfloat16)
    if float32 >= bfloat16:
        speed = f"bf16 linears {float32 / bfloat16:.2f}x faster than float32"
        speed += f" (bfloat16 needs {1 / BF16_MARGIN:.2f}x)" if dtype == torch.float32 else ""
    else:
        speed = f"bf16 linears {bfloat16 / float32:.2f}x slower than float32"
    reason = f"{speed} at this model's shapes on {cpu_name()} ({where})"
    return DtypeChoice(dtype, float32, bfloat16, reason, cached=cached)


# --- the cache ---------------------------------------------------------------------------------


@contextmanager
def _cache_lock(cache_file: Path) -> Iterator[None]:
    """One process measures at a time; without a usable lock, measure anyway."""
    from filelock import FileLock, Timeout

    lock: Any = FileLock(f"{cache_file}.lock")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=LOCK_TIMEOUT_SECONDS)
    except (OSError, Timeout) as exc:
        logger.debug("no lock beside the dtype cache %s (%s); measuring", cache_file, exc)
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _cache_entries(cache_file: Path) -> list[dict[str, Any]]:
    """The cache's well-formed entries; [] when it is missing, unreadable or of another format."""
    try:
        data = json.loads(cache_file.read_text())
    except (OSError, ValueError) as exc:  # missing included
        logger.debug("ignoring the dtype cache %s: %s", cache_file, exc)
        return []
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        logger.debug("ignoring the dtype cache %s: not format %d", cache_file, CACHE_FORMAT)
        return []
    entries = data.get("entries")
    return [e for e in entries if _well_formed(e)] if isinstance(entries, list) else []


def _well_formed(entry: Any) -> bool:  # a dict with a key and two positive, finite figures
    if not isinstance(entry, dict) or "key" not in entry:
        return False
    seconds = entry.get("float32_seconds"), entry.get("bfloat16_seconds")
    return all(isinstance(s, float) and math.isfinite(s) and s > 0 for s in seconds)


def _write_cache(cache_file: Path, key: dict[str, Any], float32: float, bfloat16: float) -> bool:
    """Add this machine's entry (replacing an older one for the same key); False if unwritable."""
    entry = {
        "key": key,
        "float32_seconds": float32,
        "bfloat16_seconds": bfloat16,
        "dtype": str(pick_dtype(float32, bfloat16)).removeprefix("torch."),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    others = [e for e in _cache_entries(cache_file) if e["key"] != key]
    body = {"format": CACHE_FORMAT, "entries": [*others, entry][-CACHE_ENTRIES:]}
    temporary = cache_file.with_name(f"{cache_file.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(body, indent=2))
        os.replace(temporary, cache_file)  # readers see the old file or the new, never half
        return True
    except OSError as exc:
        logger.debug("could not write the dtype cache %s: %s", cache_file, exc)
        with suppress(OSError):
            temporary.unlink(missing_ok=True)
        return False


# --- the CPU -----------------------------------------------------------------------------------


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module knows."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, ARM `Features`); empty where /proc is not there."""
    return set((_cpuinfo("flags", "Features") or "").split())


def _cpuinfo(*fields: str) -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    found = (line.split(":", 1) for line in lines if line.startswith(fields) and ":" in line)
    return next((value.strip() for _, value in found), None)
