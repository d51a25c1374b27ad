"""The serving benchmark's contenders: which run (`--only`, `--lora`), the command line of
each server, the random LoRA adapter they serve, and how it is loaded."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import _serve_options as options
from _serve_settings import (
    ADAPTER_ALPHA,
    ADAPTER_B_STD,
    ADAPTER_NAME,
    ADAPTER_RANK,
    ADAPTER_TARGETS,
    ALL_CONTENDERS,
    CLASSIC_CONTENDERS,
    LORA_SERVERS,
    SERVED_NAME,
    VENV_BIN,
    VLLM_KV_CACHE_GB,
    VLLM_MAX_MODEL_LEN,
)


def selected_contenders(only: str | None, lora: bool) -> list[str]:
    """The contenders to run, in running order: `--only` (default: the classic four), plus the
    adapter variant of each selected server with `--lora`."""
    names = only.split(",") if only else list(CLASSIC_CONTENDERS)
    unknown = sorted(set(names) - set(ALL_CONTENDERS))
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; choose from {', '.join(ALL_CONTENDERS)}")
    if lora:
        names += [f"{server}_lora" for server in LORA_SERVERS if server in names]
    return [key for key in ALL_CONTENDERS if key in names]


def make_adapter(folder: Path, destination: Path) -> dict[str, Any]:
    """A random PEFT LoRA adapter for the model in `folder`, saved to `destination`.

    PEFT starts B at zero (the adapter changes nothing); B is drawn small instead, so the
    adapter's outputs differ from the base model's and stay fluent.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    config = LoraConfig(
        r=ADAPTER_RANK,
        lora_alpha=ADAPTER_ALPHA,
        target_modules=ADAPTER_TARGETS,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, ADAPTER_B_STD)
    # Our server accepts an adapter whose recorded base is its model's folder (or served name).
    peft_model.peft_config["default"].base_model_name_or_path = str(folder.resolve())
    peft_model.save_pretrained(destination)
    recorded = json.loads((destination / "adapter_config.json").read_text())
    del peft_model, model
    return {
        "path": str(destination),
        "name": ADAPTER_NAME,
        "r": recorded["r"],
        "lora_alpha": recorded["lora_alpha"],
        "target_modules": sorted(recorded["target_modules"]),
        "base_model_name_or_path": recorded["base_model_name_or_path"],
        "lora_B_std": ADAPTER_B_STD,
        "seed": 0,
    }


async def post_timed(url: str, body: dict[str, Any]) -> float:
    """POST `body`; the seconds it took (an adapter load). Raises unless the answer is 200."""
    import httpx

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600.0) as client:
        response = await client.post(url, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"POST {url}: HTTP {response.status_code}: {response.text[:300]}")
    return round(time.perf_counter() - started, 2)


def ours_command(folder: Path, port: int, art_path: Path, engine: str) -> list[str]:
    return [
        str(VENV_BIN / "art-server"),
        "--model",
        str(folder),
        "--name",
        SERVED_NAME,
        "--dtype",
        options.DTYPE,
        "--engine",
        engine,
        "--path",
        str(art_path),  # a fresh folder: no checkpoints loaded at start-up; holds the adapter
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def vllm_command(folder: Path, port: int) -> list[str]:
    assert options.VLLM_PYTHON is not None
    return [
        options.VLLM_PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        SERVED_NAME,
        "--dtype",
        options.DTYPE,
        "--max-model-len",
        str(VLLM_MAX_MODEL_LEN),
        "--enable-lora",
        "--max-lora-rank",
        str(ADAPTER_RANK),
        "--max-loras",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": str(VLLM_KV_CACHE_GB),
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
