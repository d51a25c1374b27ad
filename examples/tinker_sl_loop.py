"""The Tinker cookbook's `recipes/sl_loop.py`, against art-server on a laptop CPU.

Supervised fine-tuning through the Tinker API: each batch's conversations rendered with the
model's own chat template, `cross_entropy` on the assistant's tokens only (weights 1/N over the
batch's trained tokens: the mean), AdamW, a learning rate that decays linearly to zero. The data
is local (`examples/data/tinker_arithmetic_train.jsonl`: question and answer); the held-out
questions are scored before and after with `tinker_rl_loop`'s reward.

    art-server --model smollm2-135m-instruct --api-key tml-local-key &
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local-key \\
        python examples/tinker_sl_loop.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import tinker
from tinker import types
from tinker_rl_loop import DATA, evaluate, load, prompt_tokens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="default: TINKER_BASE_URL")
    parser.add_argument("--model-name", default="smollm2-135m-instruct")
    parser.add_argument("--train", type=Path, default=DATA / "tinker_arithmetic_train.jsonl")
    parser.add_argument("--test", type=Path, default=DATA / "tinker_arithmetic_test.jsonl")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--eval-samples", type=int, default=4)
    return parser.parse_args(argv)


def sft_datums(tokenizer, rows: list[dict]) -> list[types.Datum]:
    """Prompt + answer + end of turn per row; weights on the answer's tokens, summing to 1."""
    examples = []
    for row in rows:
        prompt = prompt_tokens(tokenizer, row["question"])
        answer = tokenizer.encode(str(row["answer"]), add_special_tokens=False)
        answer.append(tokenizer.eos_token_id)
        examples.append((prompt, answer))
    trained = sum(len(answer) for _, answer in examples)
    datums = []
    for prompt, answer in examples:
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0 / trained] * len(answer)
        datums.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
            )
        )
    return datums


def main(args: argparse.Namespace) -> dict[str, float]:
    train, test = load(args.train), load(args.test)
    service_client = tinker.ServiceClient(base_url=args.base_url)
    training_client = service_client.create_lora_training_client(
        base_model=args.model_name, rank=args.lora_rank, seed=0
    ).result()
    tokenizer = training_client.get_tokenizer()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=1234)

    path = training_client.save_weights_for_sampler(name="sl-000000").result().path
    sampler = service_client.create_sampling_client(model_path=path).result()
    before = evaluate(sampler, tokenizer, test, params, args.eval_samples)
    print(f"held-out reward before: {before:.3f}", flush=True)
    for batch_idx in range(args.batches):
        start = (batch_idx * args.batch_size) % len(train)
        rows = [train[(start + i) % len(train)] for i in range(args.batch_size)]
        rate = args.learning_rate * (1 - batch_idx / args.batches)  # linear decay
        backward = training_client.forward_backward(sft_datums(tokenizer, rows), "cross_entropy")
        step = training_client.optim_step(types.AdamParams(learning_rate=rate))
        loss = backward.result().metrics["loss:sum"]
        step.result()
        print(f"batch {batch_idx + 1}/{args.batches}: loss {loss:.3f}", flush=True)
    path = training_client.save_weights_for_sampler(name="sl-final").result().path
    sampler = service_client.create_sampling_client(model_path=path).result()
    after = evaluate(sampler, tokenizer, test, params, args.eval_samples)
    print(f"held-out reward after: {after:.3f} (before {before:.3f})", flush=True)
    service_client.close("success")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main(parse_args())
