"""GPU smoke benchmark: our server and trainer on CUDA with a random model of a realistic shape.

    .venv/bin/python benchmarks/gpu_smoke.py                          # CUDA, Qwen2-0.5B shape
    .venv/bin/python benchmarks/gpu_smoke.py --shape qwen2-1.5b
    .venv/bin/python benchmarks/gpu_smoke.py --device cpu --shape tiny   # proves the script, no GPU

Nothing is downloaded. A Qwen2-shaped config is initialised at random from a fixed seed and saved
to a temporary folder with a byte-level BPE tokenizer synthesised to the config's full vocabulary
(every id the model can sample decodes to text). Then, in order:

1. `art-server` starts in a child process through `art.LocalBackend` with `--device` passed
   explicitly (its loader refuses a missing CUDA device, so a server that started ran there);
   `--engine` / `--trainer` are passed through when given. `/health` is recorded as it answers.
2. Serving: 16, 64 and 256 concurrent chat requests x 64 new tokens on the base model (EOS
   banned by `logit_bias`, so every request generates exactly 64), and 16 on the registered LoRA
   adapter (r16/alpha 32 on q, k, v, o); tokens/s = completion tokens / wall time, median of
   `--runs` after one warm-up run. The server runs with ART_ENGINE_PROFILE=1, so /metrics splits
   each decode step exactly into the forward and sampling: the share spent sampling is reported.
3. Training: `--warmup` + `--steps` GRPO steps of 4 prompts x 4 completions x 64 tokens. The reward
   is synthetic (a completion's index in its group), so every group has variance and every row
   trains: the step measures time, not learning. A step's time is its rollouts plus
   `model.train` (the trainer, the checkpoint write and serving the new step); the trainer's own
   seconds are reported beside it.

4. The peers, in the same invocation on the same model and prompts, after the server stopped
   (`_gpu_peers.py`): HF `generate()` at 16, 64 and 256 rows (min_new_tokens = 64, the same
   dtype), and TRL's `GRPOTrainer` for the step (4 x 4 x 64, LoRA r16 q/k/v/o, dapo loss, beta
   0, lr 1e-5; its peak GPU memory). `--no-peers` skips them.

On a lent GPU, one call of the device tool with `carry: [".whl"]` (`../shared/gpu/fetch-wheels.sh`
first, here), about 8 minutes for the 0.5B shape:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:$PWD/backend && \
      python3 benchmarks/gpu_smoke.py --out $OUT/gpu_smoke.json > $OUT/gpu_smoke.log 2>&1

Writes benchmarks/results/gpu_smoke.json (on CUDA; gpu_smoke_cpu.json on CPU) with the device's
name, torch and CUDA versions and the figures, and on CUDA the gpu_smoke section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine_info
from _markdown import write_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the test suite's ChatML tokenizer wrapper

from tests.support.tiny_model import SPECIAL_TOKENS, chatml_tokenizer  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
START, END = "<!-- gpu_smoke:start -->", "<!-- gpu_smoke:end -->"

# Qwen2-0.5B's and Qwen2-1.5B's published configs (tied embeddings, no sliding window); `tiny`
# is the same architecture small enough for a 2-core CPU.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": {
        "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    },
    "qwen2-1.5b": {
        "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    },
    "tiny": {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024,
        "max_position_embeddings": 2048, "rope_theta": 10000.0,
    },
}  # fmt: skip

TOPICS = [
    "a lighthouse keeper", "a dragon afraid of the dark", "a robot baking bread",
    "two friends in a desert", "a detective on a train", "a girl who talks to trees",
    "a pirate ship in a storm", "an astronaut on the moon", "a winter festival",
    "a cat who becomes mayor", "a young wizard's exam", "a musician without a voice",
    "a hidden cave", "a lost crown", "a time machine in a garage", "foxes in the city",
]  # fmt: skip
REQUESTS, MAX_TOKENS = 16, 64
ROWS_LADDER = [16, 64, 256]  # concurrent requests served on the base model (and generate() rows)
STEP_PROMPTS, STEP_COMPLETIONS = 4, 4
REQUEST_TIMEOUT = 900.0


# --------------------------------------------------------------------------- the random model


def build_random_model(folder: Path, shape: str, device: str) -> dict[str, Any]:
    """Write a random Qwen2 model of `shape` and its tokenizer into `folder`; say what was built.

    Runs in a child process (`--build-into`), so the benchmark's own process never holds the GPU.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    started = time.perf_counter()
    tokenizer = synthetic_tokenizer(SHAPES[shape]["vocab_size"])
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(
        **SHAPES[shape],
        tie_word_embeddings=True,
        use_sliding_window=False,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialising on the GPU takes seconds where the CPU takes minutes
        model = Qwen2ForCausalLM(config)
    # Realistic shapes are stored as bf16 (as Qwen2 is published); the server casts to its dtype.
    model = model.float() if shape == "tiny" else model.bfloat16()
    model.save_pretrained(folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id})
    )
    info = {
        "shape": shape,
        "config": SHAPES[shape],
        "parameters": sum(p.numel() for p in model.parameters()),
        "built_on": device,
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    info.update(device_info(torch, device))
    return info


def synthetic_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE of exactly `vocab_size` ids: 3 specials, 256 bytes, then merged pairs.

    The merges are every pair of byte symbols, then those pairs extended by one byte, in a fixed
    order: a valid BPE (each merge's parts exist before it), built in a second, no corpus needed.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    merges: list[tuple[str, str]] = []
    pairs = ((left, right) for left in alphabet for right in alphabet)
    triples = ((a + b, c) for a in alphabet for b in alphabet for c in alphabet)
    for left, right in itertools.chain(pairs, triples):
        if len(vocab) >= vocab_size:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    if len(vocab) != vocab_size:
        raise ValueError(f"cannot synthesise a tokenizer of {vocab_size} ids")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)  # already in the vocabulary: marks them special
    return chatml_tokenizer(tokenizer)


def device_info(torch: Any, device: str) -> dict[str, Any]:
    """What ran where: torch, its CUDA build, and the GPU's name and capability on CUDA."""
    info: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info.update(
            gpu_name=properties.name,
            gpu_capability=f"{properties.major}.{properties.minor}",
            gpu_memory_gib=round(properties.total_memory / 2**30, 1),
            gpu_count=torch.cuda.device_count(),
            bf16_native=torch.cuda.is_bf16_supported(including_emulation=False),
        )
    return info


def gpu_memory_used_mib() -> float | None:
    """Memory in use on GPU 0 as nvidia-smi reports it (whole device), or None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
    try:
        return float(subprocess.run(query, capture_output=True, text=True, check=True).stdout)
    except (subprocess.CalledProcessError, ValueError):
        return None


def nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"]
    result = subprocess.run(query, capture_output=True, text=True, check=False)
    return result.stdout.strip() or None


# ------------------------------------------------------------------------------- the workloads


def banned_eos(folder: Path) -> dict[str, int]:
    """`logit_bias` that keeps every request generating to max_tokens (the specials never win)."""
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    return {str(vocab[token]): -100 for token in ("<|endoftext|>", "<|im_end|>")}


def story_prompts(rows: int) -> list[str]:
    """`rows` user prompts, TOPICS cycled: what our server and the generate() peer both get."""
    return [f"Write a long story about {TOPICS[index % len(TOPICS)]}." for index in range(rows)]


async def concurrent_run(
    client: Any, model: str, bias: dict[str, int], rows: int = REQUESTS
) -> dict[str, Any]:
    """`rows` chat requests at once, 64 tokens each; tokens/s over the wall time of all."""

    async def one(prompt: str) -> int:
        response = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            logit_bias=bias,
        )
        return response.usage.completion_tokens if response.usage else 0

    started = time.perf_counter()
    tokens = await asyncio.gather(*(one(prompt) for prompt in story_prompts(rows)))
    wall = time.perf_counter() - started
    return {
        "wall_seconds": round(wall, 3),
        "completion_tokens": sum(tokens),
        "tokens_per_second": round(sum(tokens) / wall, 1),
    }


async def serving(
    client: Any,
    model: str,
    bias: dict[str, int],
    runs: int,
    rows: int = REQUESTS,
    metrics: tuple[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Median tokens/s of `runs` runs of `rows` requests; with the server's `url`, the share of
    its decode steps spent sampling over them (`metrics`: its URL and headers, for /metrics)."""
    await concurrent_run(client, model, bias, rows)  # warm-up: first kernels, allocator growth
    before = _step_parts(*metrics) if metrics else None
    measured = [await concurrent_run(client, model, bias, rows) for _ in range(runs)]
    for run in measured:
        print(f"   {model}, {rows} rows: {run}", flush=True)
    result = {
        "median_tokens_per_second": statistics.median(r["tokens_per_second"] for r in measured),
        "runs": measured,
    }
    if metrics is not None and before is not None:
        after = _step_parts(*metrics)
        forward, sampling, rows_host = (b - a for a, b in zip(before, after, strict=True))
        step = max(forward + sampling + rows_host, 1e-9)
        result["sampling_share_of_decode_step"] = round(sampling / step, 4)
        result["rows_host_share_of_decode_step"] = round(rows_host / step, 4)
    return result


def _step_parts(url: str, headers: dict[str, str]) -> tuple[float, float, float]:
    """The server's decode forward, sampling and rows seconds so far (/metrics)."""
    import httpx

    response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    response.raise_for_status()
    values = {}
    for line in response.text.splitlines():
        if line.startswith("art_decode_"):
            name, value = line.split()[:2]
            values[name] = float(value)
    return (
        values["art_decode_forward_seconds_total"],
        values["art_decode_sampling_seconds_total"],
        values["art_decode_rows_seconds_total"],
    )


async def grpo_step(art: Any, model: Any, client: Any, bias: dict[str, int]) -> dict[str, Any]:
    """One step: 4 prompts x 4 completions, synthetic rewards, then model.train."""

    async def group(topic: str) -> Any:
        messages = [{"role": "user", "content": f"Tell me about {topic}."}]
        response = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            n=STEP_COMPLETIONS,
            logit_bias=bias,
        )
        return art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*messages, choice], reward=float(choice.index))
            for choice in response.choices
        )

    started = time.perf_counter()
    groups = await asyncio.gather(*(group(topic) for topic in TOPICS[:STEP_PROMPTS]))
    generated = time.perf_counter()
    result = await model.train(list(groups), config=art.TrainConfig(learning_rate=1e-5, beta=0.0))
    finished = time.perf_counter()
    return {
        "step": result.step,
        "step_seconds": round(finished - started, 3),
        "rollout_seconds": round(generated - started, 3),
        "train_seconds": round(finished - generated, 3),
        "trainer_seconds": round(result.metrics.get("trainer_seconds", 0.0), 3),
        "trained_tokens": result.metrics.get("trained_tokens", 0.0),
    }


async def run_on_server(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start art-server on the model, measure serving then training, always stop it."""
    import httpx

    import art_core as art

    server_args = [*(["--engine", args.engine] if args.engine else [])]
    server_args += ["--trainer", args.trainer] if args.trainer else []
    result: dict[str, Any] = {"server_args": ["--device", args.device, *server_args]}
    # The server (LocalBackend's child) inherits it: decode steps split exactly on a GPU.
    os.environ["ART_ENGINE_PROFILE"] = "1"
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-art-") as art_path:
        backend = art.LocalBackend(
            path=art_path, dtype=args.dtype, device=args.device, extra_args=server_args
        )
        model = art.TrainableModel(
            name="smoke",
            project="gpu-smoke",
            base_model=str(folder),
            lora=art.LoRAConfig(
                r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
            ),
        )
        try:
            started = time.perf_counter()
            await model.register(backend)
            result["startup_seconds"] = round(time.perf_counter() - started, 1)
            result["health"] = httpx.get(f"{backend.base_url}/health", timeout=10).json()
            print(f"== server up in {result['startup_seconds']} s: {result['health']}", flush=True)
            client = model.openai_client(timeout=REQUEST_TIMEOUT, max_retries=0)
            bias = banned_eos(folder)
            key = backend._api_key  # LocalBackend's own key for its child server
            metrics = (backend.base_url, {"Authorization": f"Bearer {key}"} if key else {})
            print(f"== serving: {ROWS_LADDER} concurrent requests x {MAX_TOKENS}", flush=True)
            result["serving"] = {
                "base": {
                    str(rows): await serving(client, str(folder), bias, args.runs, rows, metrics)
                    for rows in ROWS_LADDER
                },
                "adapter": await serving(client, model.get_inference_name(), bias, args.runs),
            }
            result["gpu_memory_used_mib_after_serving"] = gpu_memory_used_mib()
            print(f"== training: {args.warmup} warm-up + {args.steps} GRPO steps", flush=True)
            steps = []
            for _ in range(args.warmup + args.steps):
                steps.append(await grpo_step(art, model, client, bias))
                print(f"   {steps[-1]}", flush=True)
            measured = steps[args.warmup :]
            result["training"] = {
                **{
                    f"median_{key}": statistics.median(s[key] for s in measured)
                    for key in ("step_seconds", "rollout_seconds", "train_seconds")
                },
                "median_trainer_seconds": statistics.median(s["trainer_seconds"] for s in measured),
                "steps": steps,
            }
            result["gpu_memory_used_mib_after_training"] = gpu_memory_used_mib()
        finally:
            await backend.close()
    return result


# ------------------------------------------------------------------------------------ report


def run_peers(folder: Path, args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    """HF generate() over the serving ladder and TRL's GRPO step, on the same model and dtype."""
    from _gpu_peers import generate_peer, trl_peer

    print(f"== peer: generate() at {ROWS_LADDER} rows x {MAX_TOKENS} tokens", flush=True)
    generate = generate_peer(
        folder,
        device=args.device,
        dtype=dtype,
        prompts=story_prompts(len(TOPICS)),
        rows_ladder=ROWS_LADDER,
        new_tokens=MAX_TOKENS,
        runs=args.runs,
    )
    print(f"== peer: TRL GRPOTrainer, 1 warm-up + {args.steps} steps", flush=True)
    prompts = [f"Tell me about {topic}." for topic in TOPICS[:STEP_PROMPTS]]
    trl = trl_peer(
        folder,
        device=args.device,
        dtype=dtype,
        prompts=prompts,
        new_tokens=MAX_TOKENS,
        steps=args.steps,
    )
    print(f"   TRL: step {trl.get('median_step_s')} s", flush=True)
    return {"generate": generate, "trl": trl}


def ratios(server: dict[str, Any], peers: dict[str, Any] | None) -> dict[str, float]:
    """Ours / generate() tokens/s at each ladder size; our GRPO step's seconds / TRL's."""
    if not peers:
        return {}
    result = {}
    for rows, ours in server["serving"]["base"].items():
        theirs = peers["generate"][rows]["median_tokens_per_second"]
        result[f"serving_{rows}_rows"] = round(ours["median_tokens_per_second"] / theirs, 3)
    trl_step = peers["trl"].get("median_step_s")
    if trl_step:
        result["grpo_step"] = round(server["training"]["median_step_seconds"] / trl_step, 3)
    return result


def _rule_dtype(args: argparse.Namespace) -> str:
    from art_backend.testing import resolve_device, resolve_dtype

    return str(resolve_dtype(args.dtype, resolve_device(args.device)))


def markdown(report: dict[str, Any]) -> str:
    model, server = report["model"], report["server"]
    where = (
        f"{model['gpu_name']} (CUDA {model['torch_cuda']}, driver {report['nvidia_driver']})"
        if report["device"] == "cuda"
        else f"CPU ({report['machine']['cpu_count']} x {report['machine']['cpu_model']})"
    )
    return f"""{START}
## GPU smoke: our server and trainer on {report["device"]} (`benchmarks/gpu_smoke.py`)

{report["machine"]["date"][:10]}, {where}, torch {model["torch"]}. A random Qwen2 model of shape
`{model["shape"]}` ({model["parameters"]:,} parameters, nothing downloaded), server
dtype `{report["dtype"]}`, art-server `{" ".join(server["server_args"])}`, /health
`{json.dumps(server["health"])}`.

{_table(report)}

Raw numbers: `{report["results_file"]}`.
{END}"""


def _table(report: dict[str, Any]) -> str:
    """The figures, each beside its peer's and the ratio, where the peers ran."""
    server, peers, ratio = report["server"], report.get("peers") or {}, report.get("ratios", {})
    serving, training = server["serving"], server["training"]
    lines = [
        "| measure | ours | peer | ours / peer |",
        "|---|---:|---:|---:|",
    ]
    for rows, ours in serving["base"].items():
        theirs = peers.get("generate", {}).get(rows, {}).get("median_tokens_per_second")
        share = ours.get("sampling_share_of_decode_step", 0.0)
        host = ours.get("rows_host_share_of_decode_step", 0.0)
        lines.append(
            f"| {rows} concurrent requests x {MAX_TOKENS} tokens, base model, tok/s (of a decode "
            f"step: sampling {share:.0%}, the rows' host work {host:.0%}) | "
            f"{ours['median_tokens_per_second']:.1f} | "
            f"{_figure(theirs, '.1f')} (`generate()`, {rows} rows) | "
            f"{_figure(ratio.get(f'serving_{rows}_rows'), '.2f', 'x')} |"
        )
    lines.append(
        f"| {REQUESTS} requests on the LoRA adapter, tok/s | "
        f"{serving['adapter']['median_tokens_per_second']:.1f} | | |"
    )
    trl = peers.get("trl", {})
    lines += [
        f"| GRPO step, {STEP_PROMPTS} x {STEP_COMPLETIONS} x {MAX_TOKENS} tokens, s (median of "
        f"{report['steps']}) | {training['median_step_seconds']:.2f} | "
        f"{_figure(trl.get('median_step_s'), '.2f')} (TRL `GRPOTrainer`) | "
        f"{_figure(ratio.get('grpo_step'), '.2f', 'x')} |",
        f"| of which rollouts, s | {training['median_rollout_seconds']:.2f} | "
        f"{_figure(trl.get('median_rollout_s'), '.2f')} | |",
        f"| of which `model.train` (trainer + checkpoint + serving the step), s | "
        f"{training['median_train_seconds']:.2f} | {_figure(trl.get('median_train_s'), '.2f')} | |",
        f"| the trainer's own seconds | {training['median_trainer_seconds']:.2f} | | |",
        f"| peak GPU memory, MiB | {_figure(server.get('gpu_memory_used_mib_after_training'), '.0f')} "
        f"(device, after training) | {_figure(trl.get('peak_gpu_memory_mib'), '.0f')} "
        "(allocated) | |",
    ]
    return "\n".join(lines)


def _figure(value: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--dtype", default="auto", help="art-server --dtype (default: auto)")
    parser.add_argument("--engine", help="art-server --engine, passed through when given")
    parser.add_argument("--trainer", help="art-server --trainer, passed through when given")
    parser.add_argument("--runs", type=int, default=3, help="serving runs per target (median)")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps measured (median)")
    parser.add_argument("--warmup", type=int, default=1, help="GRPO steps run first, not counted")
    parser.add_argument("--out", type=Path, help="results file (default: benchmarks/results/...)")
    parser.add_argument("--no-write", action="store_true", help="print, write nothing")
    parser.add_argument("--no-peers", action="store_true", help="skip generate() and TRL")
    parser.add_argument("--build-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(
            2,
            f"gpu_smoke: error: --device cuda needs a CUDA GPU and torch {torch.__version__} "
            "sees none; run `--device cpu --shape tiny` to check the script on this machine.\n",
        )
    if args.build_into:
        print(json.dumps(build_random_model(args.build_into, args.shape, args.device)))
        return

    with tempfile.TemporaryDirectory(prefix=f"gpu-smoke-{args.shape}-") as tmp:
        folder = Path(tmp) / f"random-{args.shape}"
        folder.mkdir()
        print(f"== building a random {args.shape} into {folder}", flush=True)
        build = [sys.executable, __file__, "--device", args.device, "--shape", args.shape]
        built = subprocess.run(
            [*build, "--build-into", str(folder)], capture_output=True, text=True
        )
        if built.returncode != 0:
            sys.exit(f"gpu_smoke: building the model failed:\n{built.stderr[-3000:]}")
        model_info = json.loads(built.stdout.strip().splitlines()[-1])
        print(f"   {model_info}", flush=True)
        server = asyncio.run(run_on_server(folder, args))
        dtype = str(server["health"].get("dtype") or _rule_dtype(args)).removeprefix("torch.")
        peers = None if args.no_peers else run_peers(folder, args, dtype)

    report = {
        "benchmark": "gpu_smoke",
        "device": args.device,
        "dtype": dtype,
        "runs": args.runs,
        "steps": args.steps,
        "warmup": args.warmup,
        "workload": {
            "requests": REQUESTS,
            "max_tokens": MAX_TOKENS,
            "eos_banned": True,
            "step": f"{STEP_PROMPTS} prompts x {STEP_COMPLETIONS} completions, reward = index",
            "lora": "r16 alpha32 q,k,v,o",
        },
        "machine": machine_info("transformers", "peft"),
        "nvidia_driver": nvidia_driver() if args.device == "cuda" else None,
        "model": model_info,
        "server": server,
        "peers": peers,
        "ratios": ratios(server, peers),
    }
    out = (
        args.out or RESULTS / f"gpu_smoke{'' if args.device == 'cuda' else '_cpu'}.json"
    ).resolve()
    report["results_file"] = str(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out)
    section = markdown(report)
    print(section)
    if args.no_write:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    if args.device == "cuda" and args.out is None:
        write_section(START, END, section)
        print("wrote the gpu_smoke section of BENCHMARKS.md")


if __name__ == "__main__":
    main()
