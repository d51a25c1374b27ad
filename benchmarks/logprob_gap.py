"""The gap between the sampler's logprobs and the trainer's, per dtype, on SmolLM2 through the
Tinker API against an art-server (a child process on 127.0.0.1).

The engine samples (its logprobs come from its prefill for a sequence's first token and from its
KV-cached decode steps after that); `compute_logprobs` then scores the prompt and the sampled
tokens with the trainer's forward (one full forward, no cache: `tinker/_prompt_logprobs`), on the
same weights. Per dtype (float32, bfloat16), per sampler (the base model, and a LoRA one SFT step
away from it, as RL samples), and per mode (single: one prompt, one sample at a time; batched:
every prompt at once, `--group` samples each, so rows of several lengths share the engine's
batch), reported: max and mean |sampler - trainer| over the prefill token and over the decode
tokens, and KL(sampler || trainer) estimated on the samples as mean(sampler - trainer) (the
cookbook's estimator; the samples are the sampler's own).

    .venv/bin/python benchmarks/logprob_gap.py [--prompts 4] [--group 4] [--max-tokens 32]
        [--label TEXT] [--baseline benchmarks/results/logprob_gap_before.json]

Writes benchmarks/results/logprob_gap.json and its section of BENCHMARKS.md (with the
baseline's table beside it: an earlier run's JSON, e.g. of the code before a fix).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _art_server import start_art_server
from _machine import OtherLoad, machine_info
from _markdown import publish

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "logprob_gap.json"
START, END = "<!-- logprob_gap:start -->", "<!-- logprob_gap:end -->"
MODEL = "smollm2-135m-instruct"
KEY = "tml-bench-key"
QUESTIONS = [
    "What is 17 + 25?",
    "Name three colours of the rainbow.",
    "Write one sentence about the sea.",
    "What is the capital of France, and why is it famous?",
    "Count from one to five in words.",
    "Explain in a few words what a prime number is.",
    "What is 9 times 7?",
    "Say hello in French.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "bfloat16", "bfloat16+sdpa"],
        help="dtypes to serve; DTYPE+sdpa: with ART_BATCH_INVARIANT=0 (SDPA, one-row kernels)",
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--label", default="", help="a name for this run in the results")
    parser.add_argument("--baseline", type=Path, help="an earlier run's JSON, shown beside")
    return parser.parse_args(argv)


def prompts_of(tokenizer: Any, count: int) -> list[list[int]]:
    """The first `count` questions as the chat template renders them for the assistant's turn."""
    prompts = []
    for question in QUESTIONS[:count]:
        convo = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def gaps(sampler: Any, prompts: list[list[int]], samples: int, params: Any) -> dict[str, Any]:
    """Sample every prompt (all at once), score prompt + sample with the trainer's forward, and
    the differences by where the sampler computed them: prefill (first token) or decode."""
    from tinker import types

    futures = [
        sampler.sample(types.ModelInput.from_ints(prompt), samples, params) for prompt in prompts
    ]
    sequences = [
        (prompt, sequence)
        for prompt, future in zip(prompts, futures, strict=True)
        for sequence in future.result().sequences
    ]
    return _differences(sampler, sequences)


def single_gaps(sampler: Any, prompts: list[list[int]], params: Any) -> dict[str, Any]:
    """`gaps` with one prompt and one sample at a time: the engine's batch holds one row."""
    from tinker import types

    sequences = []
    for prompt in prompts:
        response = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result()
        sequences.append((prompt, response.sequences[0]))
    return _differences(sampler, sequences)


def _differences(sampler: Any, sequences: list[tuple[list[int], Any]]) -> dict[str, Any]:
    from tinker import types

    futures = [
        sampler.compute_logprobs(types.ModelInput.from_ints(prompt + list(sequence.tokens)))
        for prompt, sequence in sequences
    ]
    # The first sampled token again, scored by a forward that ends with it: the trainer's own
    # forward of the same prefix at another length.
    firsts = [
        sampler.compute_logprobs(
            types.ModelInput.from_ints(prompt + list(sequence.tokens[:1])),
            prompt_logprobs_last_n=1,
        )
        for prompt, sequence in sequences
    ]
    prefill: list[float] = []
    decode: list[float] = []
    same_length: list[float] = []
    length_drift: list[float] = []
    for (_, sequence), future, first in zip(sequences, futures, firsts, strict=True):
        trainer = future.result()[-len(sequence.tokens) :]
        signed = [q - p for q, p in zip(sequence.logprobs, trainer, strict=True)]
        prefill.append(signed[0])
        decode += signed[1:]
        first_alone = first.result()[-1]
        same_length.append(sequence.logprobs[0] - first_alone)
        length_drift.append(trainer[0] - first_alone)
    every = prefill + decode
    return {
        "prefill_vs_trainer_at_its_length": _summary(same_length),
        "trainer_length_drift": _summary(length_drift),
        "sequences": len(sequences),
        "tokens": len(every),
        "prefill": _summary(prefill),
        "decode": _summary(decode),
        "all": _summary(every),
        "kl_sampler_trainer": sum(every) / len(every),
    }


def _summary(signed: list[float]) -> dict[str, float]:
    if not signed:
        return {"max_abs": 0.0, "mean_abs": 0.0, "tokens": 0}
    absolute = [abs(value) for value in signed]
    return {
        "max_abs": max(absolute),
        "mean_abs": sum(absolute) / len(absolute),
        "tokens": len(absolute),
    }


def measure_dtype(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every sampler and mode on one server in `spec`'s dtype (DTYPE or DTYPE+sdpa), and what
    sampling and scoring cost there."""
    import tinker
    from tinker import types

    dtype, _, attention = spec.partition("+")
    environment = {"ART_BATCH_INVARIANT": "0"} if attention == "sdpa" else {}
    with tempfile.TemporaryDirectory() as folder:
        process, url = start_art_server(
            MODEL, Path(folder), KEY, "--dtype", dtype, environment=environment
        )
        try:
            service = tinker.ServiceClient(base_url=url, api_key=KEY)
            training = service.create_lora_training_client(
                base_model=MODEL, rank=8, seed=0
            ).result()
            prompts = prompts_of(training.get_tokenizer(), args.prompts)
            _one_sft_step(training, prompts)
            path = training.save_weights_for_sampler("one-step").result().path
            samplers = {
                "base": service.create_sampling_client(base_model=MODEL).result(),
                "lora": service.create_sampling_client(model_path=path).result(),
            }
            params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=7)
            results: dict[str, Any] = {}
            for name, sampler in samplers.items():
                results[name] = {
                    "single": single_gaps(sampler, prompts, params),
                    "batched": gaps(sampler, prompts, args.group, params),
                }
            results["cost"] = cost(samplers["lora"], training, prompts, args.group, params)
            service.close("success")
            return results
        finally:
            process.terminate()
            process.wait(timeout=60)


def cost(
    sampler: Any, training: Any, prompts: list[list[int]], group: int, params: Any
) -> dict[str, Any]:
    """Seconds to sample every prompt `group` times at once (the batched mode's load) and to
    score the samples with a forward_backward, best of two, with the other load beside."""
    from tinker import types

    samples, scoring = [], []
    with OtherLoad() as load:
        for _ in range(2):
            started = time.perf_counter()
            futures = [
                sampler.sample(types.ModelInput.from_ints(prompt), group, params)
                for prompt in prompts
            ]
            sequences = [
                (prompt, list(s.tokens))
                for prompt, future in zip(prompts, futures, strict=True)
                for s in future.result().sequences
            ]
            samples.append(time.perf_counter() - started)
            data = [
                types.Datum(
                    model_input=types.ModelInput.from_ints((prompt + tokens)[:-1]),
                    loss_fn_inputs={
                        "target_tokens": (prompt + tokens)[1:],
                        "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(tokens),
                    },
                )
                for prompt, tokens in sequences
            ]
            started = time.perf_counter()
            training.forward_backward(data, "cross_entropy").result()
            scoring.append(time.perf_counter() - started)
    tokens = sum(len(tokens) for _, tokens in sequences)
    return {
        "sample_seconds": min(samples),
        "sampled_tokens": tokens,
        "forward_backward_seconds": min(scoring),
        "other_load_cores": load.cores,
    }


def _one_sft_step(training: Any, prompts: list[list[int]]) -> None:
    """Move the LoRA off zero, so the LoRA sampler's forward differs from the base model's."""
    from tinker import types

    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(prompt[:-1]),
            loss_fn_inputs={"target_tokens": prompt[1:], "weights": [1.0] * (len(prompt) - 1)},
        )
        for prompt in prompts
    ]
    training.forward_backward(data, "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()


def section(result: dict[str, Any], baseline: dict[str, Any] | None = None) -> str:
    """The BENCHMARKS.md section: one row per dtype, sampler and mode (and the baseline's)."""
    lines = [
        START,
        "## Sampler vs trainer logprobs (`benchmarks/logprob_gap.py`)",
        "",
        f"SmolLM2-135M-Instruct, {result['settings']['prompts']} prompts, "
        f"{result['settings']['max_tokens']} tokens at temperature 1; single = one row in the "
        f"engine's batch, batched = every prompt with {result['settings']['group']} samples at "
        "once. |Δ| = |sampler − trainer| per sampled token (prefill: the first token, decode: "
        "the rest); KL = mean(sampler − trainer) on the sampler's own samples. Prefill = trainer: "
        "the first token's max |sampler − trainer| when the trainer's forward ends at that "
        "token; trainer drift: the max change of the trainer's logprob of that token between "
        "that forward and the forward of the whole sample (the same prefix, another length).",
        "",
        *_table(result),
        "",
        *_cost_table(result),
        *(["", *_table(baseline)] if baseline is not None else []),
        END,
    ]
    return "\n".join(lines)


def _table(result: dict[str, Any]) -> list[str]:
    lines = [
        f"{result['label'] or 'This run'} ({result['machine'].get('date', '')})",
        "",
        "| dtype | sampler | mode | tokens | mean abs Δ | max abs Δ | prefill max | decode max "
        "| KL | prefill = trainer | trainer drift |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, samplers in result["dtypes"].items():
        for sampler, modes in samplers.items():
            if sampler == "cost":
                continue
            for mode, gap in modes.items():
                lines.append(
                    f"| {dtype} | {sampler} | {mode} | {gap['tokens']} "
                    f"| {gap['all']['mean_abs']:.2e} | {gap['all']['max_abs']:.2e} "
                    f"| {gap['prefill']['max_abs']:.2e} | {gap['decode']['max_abs']:.2e} "
                    f"| {gap['kl_sampler_trainer']:.1e} "
                    f"| {_maximum(gap, 'prefill_vs_trainer_at_its_length')} "
                    f"| {_maximum(gap, 'trainer_length_drift')} |"
                )
    return lines


def _cost_table(result: dict[str, Any]) -> list[str]:
    """What each dtype's sampling and scoring took (best of two; the other load beside)."""
    lines = [
        "What it costs: every prompt × group sampled at once from the LoRA sampler, then those "
        "samples scored by one `forward_backward` (best of two runs).",
        "",
        "| dtype | sampled tokens | sampling s | tokens/s | forward_backward s | other load |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for dtype, samplers in result["dtypes"].items():
        cost = samplers.get("cost")
        if cost:
            lines.append(
                f"| {dtype} | {cost['sampled_tokens']} | {cost['sample_seconds']:.2f} "
                f"| {cost['sampled_tokens'] / cost['sample_seconds']:.1f} "
                f"| {cost['forward_backward_seconds']:.2f} | {cost['other_load_cores']:.2f} |"
            )
    return lines


def _maximum(gap: dict[str, Any], key: str) -> str:
    """A summary's max |Δ|, or a dash for a run made before it was measured."""
    return f"{gap[key]['max_abs']:.2e}" if key in gap else "–"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure every dtype; write the results and the BENCHMARKS.md section."""
    args = parse_args(argv)
    result = {
        "machine": machine_info("torch", "transformers", "peft", "tinker"),
        "label": args.label,
        "settings": {
            "model": MODEL,
            "prompts": args.prompts,
            "group": args.group,
            "max_tokens": args.max_tokens,
        },
        "dtypes": {dtype: measure_dtype(dtype, args) for dtype in args.dtypes},
    }
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    publish(result, RESULTS, START, END, section(result, baseline))
    return result


if __name__ == "__main__":
    main()
