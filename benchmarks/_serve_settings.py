"""The serving benchmark's fixed settings: paths, timeouts, contenders, the adapter, section
markers, and the names of a run's result files."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "serve_throughput.json"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
VENV_BIN = Path(sys.executable).parent


def _auto_dtype() -> str:
    """What `--dtype auto` gives on this machine's CPU: bf16 only with native bf16 instructions."""
    from art_backend.testing import cpu_supports_bf16

    return "bfloat16" if cpu_supports_bf16() else "float32"


DEFAULT_DTYPE = _auto_dtype()  # the dtype users get by default here
SERVED_NAME = "smol"

STARTUP_TIMEOUT = 600.0  # model load on a busy 2-core machine
REQUEST_TIMEOUT = 900.0  # one request, including queueing behind 15 others on a sequential server
STOP_TIMEOUT = 30.0
SECTION_START = "<!-- serve_throughput:start -->"  # the default dtype's section
SECTION_END = "<!-- serve_throughput:end -->"

CLASSIC_CONTENDERS = ("ours", "transformers_serve", "transformers_serve_cb", "offline_generate")
VLLM_CONTENDERS = ("ours_vllm", "vllm")  # need vLLM; only run when named in --only
LORA_SERVERS = ("ours", "ours_vllm", "vllm")  # each has a `<name>_lora` variant
ALL_CONTENDERS = (
    *CLASSIC_CONTENDERS,
    *VLLM_CONTENDERS,
    *(f"{server}_lora" for server in LORA_SERVERS),
)

# The adapter of the `_lora` contenders: random, with B != 0 so its outputs differ from the base.
ADAPTER_NAME = "smol-lora@1"  # our server serves adapters as `<name>@<step>`
ADAPTER_RANK, ADAPTER_ALPHA = 16, 32
ADAPTER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
ADAPTER_B_STD = 0.02  # PEFT starts B at zero (a no-op adapter); this changes outputs, not fluency
VLLM_MAX_MODEL_LEN = 2048  # raw vLLM's context; ours starts vLLM with the model's own
VLLM_KV_CACHE_GB = 2  # VLLM_CPU_KVCACHE_SPACE, the same as art-server's --vllm-kv-cache-gb default


def report_suffix(dtype: str, engines: bool, busy: int) -> str:
    """The name of a run's results: "" (default dtype), "_float32", "_engines", "_engines_busy"..."""
    if engines:
        parts = ["engines"] + ([] if dtype == "float32" else [dtype])
    else:
        parts = [] if dtype == DEFAULT_DTYPE else [dtype]
    if busy:
        parts.append("busy")
    return "".join(f"_{part}" for part in parts)


def results_path(suffix: str) -> Path:
    """serve_throughput<suffix>.json beside the default run's serve_throughput.json."""
    return RESULTS.with_name(f"serve_throughput{suffix}.json")


def section_markers(suffix: str) -> tuple[str, str]:
    """The engine runs, quiet and busy, share one section; every other run has its own."""
    if suffix == "":
        return SECTION_START, SECTION_END
    key = suffix.removesuffix("_busy") if suffix.startswith("_engines") else suffix
    return f"<!-- serve_throughput{key}:start -->", f"<!-- serve_throughput{key}:end -->"


RSS_TARGET_MB = 1536.0
CONTENDED_CORES = 0.3  # other processes' mean CPU use above which a run is repeated
