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

from tinker import types
from tinker_rl_loop import evaluate, load, loop_parser, open_run, prompt_tokens, sampler_at


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return loop_parser(__doc__.splitlines()[0], batches=10, batch_size=16).parse_args(argv)


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
    service_client, training_client, tokenizer = open_run(args)
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=1234)

    sampler = sampler_at(service_client, training_client, "sl-000000")
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
    sampler = sampler_at(service_client, training_client, "sl-final")
    after = evaluate(sampler, tokenizer, test, params, args.eval_samples)
    print(f"held-out reward after: {after:.3f} (before {before:.3f})", flush=True)
    service_client.close("success")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main(parse_args())
