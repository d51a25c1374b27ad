"""Four of the Tinker cookbook's recipes (tinker-cookbook 0.6.1) against art-server, local data.

Each recipe runs through its own entry point (`cli_main` of its CLI) with its own defaults:

- `chat_sl` (supervised fine-tuning, `recipes/chat_sl/train.py`) on a local JSONL of chats;
- `math_rl` (`recipes/math_rl/train.py`): its default environment (arithmetic, made locally) and
  its default loss, `stable_reinforce`, with the samplers' stability records;
- `dpo` (`recipes/preference/dpo/train.py`): its default dataset is Anthropic's hh-rlhf; here a
  few local pairs in hh-rlhf's own text form, parsed by the recipe's own parser;
- `distillation` (`recipes/distillation/on_policy_distillation.py`): its default prompts are
  DeepMath's; here a few local ones; the teacher is the served base model.

What changes from the defaults, and only that: the server (`base_url`), the model (the served
base model), the renderer (`qwen3_instruct`: ChatML without thinking, which is SmolLM2's chat
template token for token; the cookbook knows no renderer for models outside its own list), the
sizes (batch, steps, tokens), the log folder, and the data (the hub downloads above replaced by
small local sets). The recipes write their metrics to `<log>/metrics.jsonl`, one row per step.

    .venv/bin/python examples/tinker_cookbook_recipes.py --base-url http://127.0.0.1:8000 \\
        --model HuggingFaceTB/SmolLM2-135M-Instruct --tokenizer <the model's folder> \\
        --api-key <key> chat_sl math_rl dpo distillation

`benchmarks/cookbook_recipes.py` runs the four on SmolLM2 and records their metric trends;
tests/server/tinker/test_cookbook_recipes.py runs them on the tests' tiny model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ChatML without <think>: SmolLM2-Instruct's chat template, token for token.
RENDERER = "qwen3_instruct"


@dataclass
class RecipeRun:
    """Where and how small one recipe runs: the server, the model, the sizes, the log folder."""

    base_url: str
    model_name: str
    log_path: Path
    steps: int = 3
    batch: int = 4  # sequences (chat_sl, dpo pairs) or groups (math_rl, distillation) a step
    max_tokens: int = 16  # distillation's sampled tokens (math_rl keeps its default, 5)
    # None keeps each recipe's own; distillation's 128 is wider than the tests' tiny model
    lora_rank: int | None = None


# ------------------------------------------------------------------------------ the local data


def chats() -> list[dict[str, Any]]:
    """chat_sl's conversations: short questions with one-word answers."""
    pairs = [("What colour is the sky?", "Blue."), ("What is 2 + 2?", "4."),
             ("Name a fruit.", "Apple."), ("What do bees make?", "Honey."),
             ("Opposite of hot?", "Cold."), ("How many legs has a cat?", "Four."),
             ("What is frozen water?", "Ice."), ("Say hello.", "Hello!")]  # fmt: skip
    return [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in pairs * 8
    ]


def preference_pairs() -> list[dict[str, str]]:
    """DPO's pairs, in hh-rlhf's text form (`\\n\\nHuman: ...\\n\\nAssistant: ...`): chosen is
    the short polite answer, rejected the curt one."""
    rows = [("What is 3 + 4?", "3 + 4 is 7.", "No."), ("Name a colour.", "Red.", "Whatever."),
            ("Is water wet?", "Yes, water is wet.", "Go away."),
            ("What is the capital of France?", "Paris.", "Don't care."),
            ("Say thanks.", "Thank you!", "No."),
            ("What is 10 - 3?", "10 - 3 is 7.", "Later.")]  # fmt: skip
    return [
        {
            "chosen": f"\n\nHuman: {question}\n\nAssistant: {good}",
            "rejected": f"\n\nHuman: {question}\n\nAssistant: {bad}",
        }
        for question, good, bad in rows * 8
    ]


def distillation_prompts() -> list[str]:
    """Prompts for on-policy distillation: the student samples, the teacher scores."""
    return [f"What is {a} times {b}? Explain briefly." for a in range(2, 6) for b in range(3, 7)]


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """For the length of a block, the recipes download nothing: the local sets above replace
    their hub datasets (hh-rlhf for DPO, DeepMath for distillation), and the price list of
    Tinker's hosted service, which they fetch to log costs, is taken as unavailable (as after a
    failed fetch: they log token counts only)."""
    import datasets
    from tinker_cookbook.distillation import datasets as distillation_data
    from tinker_cookbook.recipes.preference import datasets as preference_data
    from tinker_cookbook.utils import cost_estimation

    def hh_rlhf(self: Any) -> tuple[datasets.Dataset, datasets.Dataset | None]:
        return datasets.Dataset.from_list(preference_pairs()), None

    def deepmath(split: str = "train") -> list[str] | None:
        return distillation_prompts() if split == "train" else None

    hhh = preference_data.HHHComparisonBuilder
    saved = hhh.get_train_and_test_datasets, distillation_data.load_deepmath_prompts
    fetched = cost_estimation._pricing_fetched  # the cookbook's own "fetched once" flag
    hhh.get_train_and_test_datasets = hh_rlhf  # type: ignore[method-assign]
    distillation_data.load_deepmath_prompts = deepmath
    cost_estimation._pricing_fetched = True
    try:
        yield
    finally:
        hhh.get_train_and_test_datasets = saved[0]  # type: ignore[method-assign]
        distillation_data.load_deepmath_prompts = saved[1]
        cost_estimation._pricing_fetched = fetched


def use_local_tokenizer(model_name: str, folder: Path | str) -> None:
    """Make the cookbook load `model_name`'s tokenizer from `folder` (offline: it would ask the
    hub), through its own registry (`tokenizer_utils.register_tokenizer`)."""
    from tinker_cookbook.tokenizer_utils import register_tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    register_tokenizer(model_name, lambda: tokenizer)


# ------------------------------------------------------------------------------ the recipes


def run_chat_sl(run: RecipeRun) -> None:
    """recipes/chat_sl/train.py on the local chats."""
    from tinker_cookbook.recipes.chat_sl import train

    data = run.log_path.parent / f"{run.log_path.name}-chats.jsonl"
    data.write_text("".join(json.dumps(chat) + "\n" for chat in chats()))
    config = train.CLIConfig(**common(run), dataset=str(data), batch_size=run.batch)
    with offline():
        train.cli_main(config)


def run_math_rl(run: RecipeRun) -> None:
    """recipes/math_rl/train.py: the arithmetic environment, `stable_reinforce`."""
    from tinker_cookbook.recipes.math_rl import train

    config = train.CLIConfig(**common(run), groups_per_batch=run.batch)
    with offline():
        asyncio.run(train.cli_main(config))


def run_dpo(run: RecipeRun) -> None:
    """recipes/preference/dpo/train.py on the local pairs (its default dataset, hhh)."""
    from tinker_cookbook.recipes.preference.dpo import train

    with offline():
        train.cli_main(train.CLIConfig(**common(run), batch_size=run.batch))


def run_distillation(run: RecipeRun) -> None:
    """recipes/distillation/on_policy_distillation.py: the served base model teaches a LoRA
    student of itself, on the local prompts (its default dataset, deepmath)."""
    from tinker_cookbook.recipes.distillation import on_policy_distillation as recipe

    config = recipe.CLIConfig(
        **common(run),
        teacher_model=run.model_name,
        groups_per_batch=run.batch,
        max_tokens=run.max_tokens,
        **({} if run.lora_rank is None else {"lora_rank": run.lora_rank}),
    )
    with offline():
        asyncio.run(recipe.cli_main(config))


def common(run: RecipeRun) -> dict[str, Any]:
    """The settings every recipe's CLIConfig takes the same way."""
    return {
        "base_url": run.base_url,
        "model_name": run.model_name,
        "renderer_name": RENDERER,
        "log_path": str(run.log_path),
        "max_steps": run.steps,
        "behavior_if_log_dir_exists": "delete",
    }


RECIPES: dict[str, Callable[[RecipeRun], None]] = {
    "chat_sl": run_chat_sl,
    "math_rl": run_math_rl,
    "dpo": run_dpo,
    "distillation": run_distillation,
}


def metrics(log_path: Path) -> list[dict[str, Any]]:
    """The rows a recipe wrote to `<log>/metrics.jsonl`, in order."""
    lines = (log_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", help=f"some of {', '.join(RECIPES)} (all by default)")
    parser.add_argument("--base-url", default=os.environ.get("TINKER_BASE_URL"))
    parser.add_argument("--api-key", default=os.environ.get("TINKER_API_KEY"))
    parser.add_argument("--model", required=True, help="the served base model's name")
    parser.add_argument("--tokenizer", help="a folder with the model's tokenizer (offline)")
    parser.add_argument("--log-dir", type=Path, default=Path("cookbook-runs"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the recipes named on the command line, one after another; print each one's last row."""
    args = parse_args(argv)
    unknown = [name for name in args.recipes if name not in RECIPES]
    if unknown:
        raise SystemExit(f"Unknown recipes {unknown}: name some of {', '.join(RECIPES)}.")
    if args.api_key:
        os.environ["TINKER_API_KEY"] = args.api_key
    if args.tokenizer:
        use_local_tokenizer(args.model, args.tokenizer)
    for name in args.recipes or RECIPES:
        run = RecipeRun(args.base_url, args.model, args.log_dir / name, args.steps, args.batch)
        run.log_path.parent.mkdir(parents=True, exist_ok=True)
        RECIPES[name](run)
        print(name, json.dumps(metrics(run.log_path)[-1]))


if __name__ == "__main__":
    main()
