"""The Tinker cookbook's `recipes/rl_loop.py`, against art-server on a laptop CPU.

The loop is the cookbook's (sampler weights each batch, a group of samples per question, reward
minus the group's mean as the advantage, questions whose group all scored the same skipped,
`importance_sampling`, AdamW), with what it needs from `tinker_cookbook` written out here: the
chat template is the tokenizer's own (the cookbook's renderer), the data is local JSONL
(`examples/data/tinker_arithmetic_{train,test}.jsonl`, not GSM8K from the hub) and the reward
reads the last number of the answer. It evaluates the held-out questions before and after.

    art-server --model smollm2-135m-instruct --api-key tml-local-key &
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local-key \\
        python examples/tinker_rl_loop.py
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from pathlib import Path

import tinker
from tinker import types

DATA = Path(__file__).resolve().parent / "data"
NUMBER = re.compile(r"-?\d+")


def loop_parser(description: str, *, batches: int, batch_size: int) -> argparse.ArgumentParser:
    """The options both loops take (the SL loop adds nothing; the RL loop its sampling)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--base-url", default=None, help="default: TINKER_BASE_URL")
    parser.add_argument("--model-name", default="smollm2-135m-instruct")
    parser.add_argument("--train", type=Path, default=DATA / "tinker_arithmetic_train.jsonl")
    parser.add_argument("--test", type=Path, default=DATA / "tinker_arithmetic_test.jsonl")
    parser.add_argument("--batches", type=int, default=batches)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--eval-samples", type=int, default=4)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = loop_parser(__doc__.splitlines()[0], batches=8, batch_size=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=12)
    return parser.parse_args(argv)


def open_run(args: argparse.Namespace):
    """The service client, a new LoRA training client on the model, and its tokenizer."""
    service_client = tinker.ServiceClient(base_url=args.base_url)
    training_client = service_client.create_lora_training_client(
        base_model=args.model_name, rank=args.lora_rank, seed=0
    ).result()
    return service_client, training_client, training_client.get_tokenizer()


def sampler_at(service_client, training_client, name: str):
    """A sampling client on the training client's weights now, saved as `name`."""
    path = training_client.save_weights_for_sampler(name=name).result().path
    return service_client.create_sampling_client(model_path=path).result()


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def get_reward(response: str, answer: int) -> float:
    """1 for an answer that is the right number alone; partial credit on the way there (the
    base model rarely answers with the number only): 0.5 for the right number last among other
    words ("7 + 5 is 12."), 0.2 for a wrong number alone, 0 otherwise."""
    text = response.strip().rstrip(".")
    found = NUMBER.findall(text)
    if not found:
        return 0.0
    right = int(found[-1]) == answer
    alone = found[-1] == text
    return 1.0 if right and alone else 0.5 if right else 0.2 if alone else 0.0


def prompt_tokens(tokenizer, question: str) -> list[int]:
    """The question as the model's chat template renders it, ready for the assistant's turn."""
    convo = [{"role": "user", "content": f"{question} Answer with the number only."}]
    text = tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def evaluate(sampler, tokenizer, rows: list[dict], params, samples: int) -> float:
    """The mean reward over the held-out questions, `samples` answers each."""
    futures = [
        (row, sampler.sample(types.ModelInput.from_ints(prompt_tokens(tokenizer, row["question"])),
                             num_samples=samples, sampling_params=params))
        for row in rows
    ]  # fmt: skip
    rewards = [
        get_reward(tokenizer.decode(sequence.tokens, skip_special_tokens=True), row["answer"])
        for row, future in futures
        for sequence in future.result().sequences
    ]
    return sum(rewards) / len(rewards)


def group_datums(prompt: list[int], sequences, rewards: list[float]) -> list[types.Datum]:
    """The cookbook's datums of one group: advantage = reward - the group's mean, zero on the
    prompt; none when every reward is the same."""
    mean = sum(rewards) / len(rewards)
    advantages = [reward - mean for reward in rewards]
    if all(advantage == 0.0 for advantage in advantages):
        return []
    datums = []
    for sequence, advantage in zip(sequences, advantages, strict=True):
        tokens = prompt + list(sequence.tokens)
        ob_len = len(prompt) - 1
        datums.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * ob_len + list(sequence.logprobs),
                    "advantages": [0.0] * ob_len + [advantage] * len(sequence.tokens),
                },
            )
        )
    return datums


def main(args: argparse.Namespace) -> dict[str, float]:
    logging.getLogger("tinker").setLevel(logging.ERROR)  # its notes on long polls, not ours
    train, test = load(args.train), load(args.test)
    service_client, training_client, tokenizer = open_run(args)
    sampling_params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    eval_params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1234)
    adam_params = types.AdamParams(learning_rate=args.learning_rate, beta1=0.9, beta2=0.95)

    sampler = sampler_at(service_client, training_client, "000000")
    before = evaluate(sampler, tokenizer, test, eval_params, args.eval_samples)
    print(f"held-out reward before: {before:.3f}", flush=True)

    for batch_idx in range(args.batches):
        started = time.time()
        start = (batch_idx * args.batch_size) % len(train)
        rows = [train[(start + i) % len(train)] for i in range(args.batch_size)]
        futures = []
        for row in rows:
            prompt = prompt_tokens(tokenizer, row["question"])
            future = sampler.sample(
                types.ModelInput.from_ints(prompt),
                num_samples=args.group_size,
                sampling_params=sampling_params,
            )
            futures.append((prompt, future, row["answer"]))
        datums, batch_rewards = [], []
        for prompt, future, answer in futures:
            sequences = future.result().sequences
            rewards = [
                get_reward(tokenizer.decode(s.tokens, skip_special_tokens=True), answer)
                for s in sequences
            ]
            batch_rewards.append(sum(rewards) / len(rewards))
            datums += group_datums(prompt, sequences, rewards)
        if datums:
            backward = training_client.forward_backward(datums, loss_fn="importance_sampling")
            step = training_client.optim_step(adam_params)
            backward.result(), step.result()
        sampler = sampler_at(service_client, training_client, f"{batch_idx + 1:06d}")
        reward = sum(batch_rewards) / len(batch_rewards)
        print(
            f"batch {batch_idx + 1}/{args.batches}: reward {reward:.3f}, {len(datums)} datums, "
            f"{time.time() - started:.1f} s",
            flush=True,
        )

    after = evaluate(sampler, tokenizer, test, eval_params, args.eval_samples)
    print(f"held-out reward after: {after:.3f} (before {before:.3f})", flush=True)
    service_client.close("success")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main(parse_args())
