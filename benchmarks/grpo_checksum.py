"""Checksum of one GRPO step, to prove a refactor leaves training bit-identical.

Builds the test suite's tiny random model (tests/support/tiny_model.py, seed 0), starts the real
server through `art.LocalBackend`, samples a fixed set of completions (one request per
completion, each with its own `seed`, temperature 1, sent one after another), gives them fixed
rewards (1.0/0.0 alternating within each group, so every advantage is non-zero), runs one
`model.train` step at learning rate 1e-3 and prints one JSON line: the sha256 of the step-1
adapter weights (the file and its tensors), of the sampled texts and of the train request body
(ids normalised), plus which `art_core` / `art_backend` the client and the server child imported.

    .venv/bin/python benchmarks/grpo_checksum.py [--dump-dir DIR]

Run it from another checkout (a `git worktree`) with that checkout's folders first on PYTHONPATH
to compare two commits. `--dump-dir` keeps the train request body, the metrics and the server
log for a diff. Only public names that older commits also have are used.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's tests/

import art_core as art
from tests.support.tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent

PROJECT, NAME = "checksum", "grpo-checksum"
PROMPTS = [
    "What is the capital of France?",
    "Answer with just the number. 12 + 7 =",
    "Hello! How can I help you today?",
]
GROUP_SIZE = 4
MAX_TOKENS = 16
LEARNING_RATE = 1e-3
TINY_MODEL_SEED = 0

# Loaded by the server child through PYTHONPATH: it writes which art_core / art_backend it
# imported (`<pid>.json` in GRPO_CHECKSUM_PROBE_OUT), then stops looking.
PROBE = """\
import json, os, sys, threading, time


def _probe():
    out = os.environ.get("GRPO_CHECKSUM_PROBE_OUT")
    deadline = time.monotonic() + 300
    while out and time.monotonic() < deadline:
        core, backend = sys.modules.get("art_core"), sys.modules.get("art_backend")
        if core is not None and backend is not None:
            path = os.path.join(out, f"{os.getpid()}.json")
            with open(path, "w") as f:
                json.dump({"argv": sys.argv, "art_core": getattr(core, "__file__", None),
                           "art_backend": getattr(backend, "__file__", None)}, f)
            return
        time.sleep(0.05)


threading.Thread(target=_probe, daemon=True).start()
"""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_folder(folder: Path) -> str:
    """One hash over every file's relative name and bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def sha256_tensors(path: Path) -> str:
    """One hash over the tensors of a safetensors file (name, dtype, shape, bytes), name order:
    equal even where the file's header metadata differs."""
    from safetensors.numpy import load_file

    digest = hashlib.sha256()
    for name, array in sorted(load_file(str(path)).items()):
        digest.update(f"{name}|{array.dtype}|{list(array.shape)}".encode() + b"\0")
        digest.update(array.tobytes() + b"\0")
    return digest.hexdigest()


def normalised_body(body: Any) -> Any:
    """The train request body with the server's random completion ids numbered in order."""
    ids: dict[str, str] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: (
                    ids.setdefault(item, f"<completion {len(ids)}>")
                    if key == "completion_id" and isinstance(item, str)
                    else walk(item)
                )
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(body)


def capture_bodies() -> tuple[list[Any], list[Any]]:
    """Record the JSON bodies of the POSTs this process sends to register and to train."""
    bodies: list[Any] = []
    registers: list[Any] = []
    send = httpx.AsyncClient.send

    async def recording_send(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any):
        if request.method == "POST" and request.url.path.endswith("/train"):
            bodies.append(json.loads(request.content))
        elif request.method == "POST" and request.url.path == "/v1/training/models":
            registers.append(json.loads(request.content))
        return await send(self, request, **kwargs)

    httpx.AsyncClient.send = recording_send  # type: ignore[method-assign]
    return bodies, registers


def git_commit() -> str | None:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() or None


async def sample_groups(model: art.TrainableModel) -> tuple[list[art.TrajectoryGroup], list[str]]:
    client = model.openai_client()
    groups, texts = [], []
    for p, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": prompt}]
        trajectories = []
        for i in range(GROUP_SIZE):
            response = await client.chat.completions.create(
                model=model.get_inference_name(),
                messages=messages,  # type: ignore[arg-type]
                max_tokens=MAX_TOKENS,
                temperature=1.0,
                seed=1000 + 100 * p + i,
            )
            choice = response.choices[0]
            texts.append(choice.message.content or "")
            trajectories.append(
                art.Trajectory(
                    id=f"traj-{p}-{i}",
                    messages_and_choices=[*messages, choice],
                    reward=1.0 if i % 2 == 0 else 0.0,
                )
            )
        groups.append(art.TrajectoryGroup(trajectories))
    return groups, texts


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model_dir = build_tiny_model(work / "tiny-model", seed=TINY_MODEL_SEED)
    probe_dir, probe_out = work / "probe", work / "probe-out"
    probe_dir.mkdir()
    probe_out.mkdir()
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(probe_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ["GRPO_CHECKSUM_PROBE_OUT"] = str(probe_out)
    for key in [k for k in os.environ if k.startswith("LANGFUSE_")]:
        del os.environ[key]  # no export in the background

    bodies, registers = capture_bodies()
    # A fixed thread count: `--threads auto` follows the cores other processes leave idle, and
    # another count splits the matmuls' sums differently (measured: two runs of eafed61 on a
    # busy machine gave two adapter hashes; with a fixed count, one).
    backend = art.LocalBackend(
        path=work / "art",
        dtype=args.dtype,
        device=args.device,
        extra_args=["--threads", str(args.threads)],
    )
    try:
        model = art.TrainableModel(name=NAME, project=PROJECT, base_model=str(model_dir))
        await model.register(backend)
        groups, texts = await sample_groups(model)
        result = await model.train(groups, config=art.TrainConfig(learning_rate=LEARNING_RATE))
    finally:
        await backend.close()
        log = (work / "art" / "backend.log").read_text(errors="replace")

    checkpoint = work / "art" / PROJECT / "models" / NAME / "checkpoints" / f"{result.step:04d}"
    adapter = checkpoint / "adapter_model.safetensors"
    body = normalised_body(bodies[0]) if len(bodies) == 1 else None
    # What each Python child of this run imported (the server: argv[0] is art_backend/cli.py).
    servers = [json.loads(path.read_text()) for path in sorted(probe_out.glob("*.json"))]
    # PEFT records the base model's folder (a new temporary folder each run: named <work>) and
    # its target modules as a set (in string-hash order, which changes each run: sorted).
    config = json.loads(
        (checkpoint / "adapter_config.json").read_text().replace(str(work), "<work>")
    )
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    adapter_config = json.dumps(config, indent=1, sort_keys=True)
    if args.dump_dir:
        dump = Path(args.dump_dir)
        dump.mkdir(parents=True, exist_ok=True)
        text = json.dumps(registers, indent=1, sort_keys=True).replace(str(work), "<work>")
        (dump / "register_body.json").write_text(text)
        (dump / "train_body.json").write_text(json.dumps(bodies, indent=1, sort_keys=True))
        (dump / "train_body.normalised.json").write_text(json.dumps(body, indent=1, sort_keys=True))
        (dump / "metrics.json").write_text(json.dumps(result.metrics, indent=1, sort_keys=True))
        (dump / "texts.json").write_text(json.dumps(texts, indent=1))
        (dump / "backend.log").write_text(log)
        (dump / "adapter_config.json").write_text(adapter_config)
    backend_spec = importlib.util.find_spec("art_backend")
    return {
        "commit": git_commit(),
        "step": result.step,
        "adapter_sha256": sha256_bytes(adapter.read_bytes()),
        "adapter_tensors_sha256": sha256_tensors(adapter),
        "adapter_config_sha256": sha256_bytes(adapter_config.encode()),
        "completions_sha256": sha256_bytes(json.dumps(texts, ensure_ascii=False).encode()),
        "train_body_sha256": (
            sha256_bytes(json.dumps(body, sort_keys=True).encode()) if body is not None else None
        ),
        "register_body_sha256": sha256_bytes(
            json.dumps(registers, sort_keys=True).replace(str(work), "<work>").encode()
        ),
        "tiny_model_sha256": sha256_folder(model_dir),
        "checkpoint_path_as_reported": (
            result.checkpoint_path is None or Path(result.checkpoint_path) == checkpoint
        ),
        "client": {
            "art_core": art.__file__,
            "art_backend": backend_spec.origin if backend_spec else None,
        },
        "server": servers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--dump-dir", help="keep the train body, metrics, texts and server log")
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grpo-checksum-") as work:
        print(json.dumps(asyncio.run(run(args, Path(work)))), flush=True)


if __name__ == "__main__":
    main()
