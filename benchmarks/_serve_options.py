"""The serving benchmark's run-wide options, set once by `serve_throughput.main` from its command
line and read by every contender; and what follows from them (a child's environment, the load
above which a run counts as contended)."""

from __future__ import annotations

import os

from _serve_settings import CONTENDED_CORES, DEFAULT_DTYPE

DTYPE = DEFAULT_DTYPE  # --dtype: the same for every contender
THREADS: int | None = None  # --threads: OMP_NUM_THREADS for every contender
BUSY = 0  # --busy: foreign busy processes during every timed run
VLLM_PYTHON: str | None = None  # --vllm-python: the interpreter with vLLM installed


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if THREADS is not None:
        env["OMP_NUM_THREADS"] = str(THREADS)
    env.update(extra or {})
    return env


def contended_above() -> float:
    """Foreign load (cores) above which a run is repeated; `--busy` processes are expected."""
    return CONTENDED_CORES + BUSY
