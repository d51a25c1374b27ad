"""RULER judge prompt size: ours (shared context once, identical runs merged, long messages cut)
vs the naive layout (ART's RULER prompt without its prefix dedup: every trajectory serialized in
full as JSON), on one group of 8 multi-turn tool-using trajectories; and the cache on a repeated
step (our judge: SmolLM2-135M-Instruct served by our backend, so the second step is measured
for real).

    python benchmarks/ruler_prompt.py [--skip-judge]

Tokens are counted with SmolLM2's tokenizer; target: ours <= 0.5x the naive prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _markdown import publish

import art_core as art
from art_core.rewards._ruler_prompt import (
    DEFAULT_RUBRIC,
    SYSTEM_PROMPT,
    build_judge_prompt,
    distinct_runs,
)

RESULTS = Path(__file__).resolve().parent / "results" / "ruler_prompt.json"
START, END = "<!-- ruler_prompt:start -->", "<!-- ruler_prompt:end -->"

POLICY = " ".join(
    f"Rule {i}: refunds over {i * 10} euros need a manager's approval; never promise delivery "
    f"dates the carrier has not confirmed; quote order numbers exactly as the system shows them."
    for i in range(1, 13)
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    key: {"type": "string", "description": f"The {key}."} for key in keys
                },
                "required": list(keys),
            },
        },
    }
    for name, description, keys in [
        ("search_orders", "Search the customer's orders by text.", ["customer_id", "query"]),
        ("get_order", "Full details of one order, with its items and shipments.", ["order_id"]),
        ("track_shipment", "Carrier tracking events of a shipment.", ["tracking_number"]),
        ("issue_refund", "Refund an order or part of it.", ["order_id", "amount", "reason"]),
    ]
]


def tool_result(rng: random.Random, size: int) -> str:
    rows = [
        {
            "order_id": f"ORD-{rng.randint(10000, 99999)}",
            "status": rng.choice(["shipped", "delivered", "processing", "returned"]),
            "items": [{"sku": f"SKU-{rng.randint(100, 999)}", "qty": rng.randint(1, 3)}],
            "total_eur": round(rng.uniform(5, 400), 2),
        }
        for _ in range(size)
    ]
    return json.dumps({"results": rows})


def trajectory(index: int) -> list[dict[str, Any]]:
    """A support-agent run: search (the same first call in every run), then 1-3 more tool calls
    with their results (order searches return long JSON), then an answer."""
    rng = random.Random(index)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are the support agent of a web shop. {POLICY}"},
        {
            "role": "user",
            "content": "Hi, my headphones order from last month never arrived and I was charged "
            "twice. Customer id C-4821. Can you sort this out?",
        },
    ]
    calls = [("search_orders", {"customer_id": "C-4821", "query": "headphones"}, 40)]
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(["get_order", "track_shipment", "issue_refund", "search_orders"])
        calls.append((name, {"order_id": f"ORD-{rng.randint(10000, 99999)}"}, rng.randint(2, 60)))
    for turn, (name, arguments, size) in enumerate(calls):
        call_id = f"call_{index}_{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
        )
        result_rng = random.Random(1000 * turn + (0 if turn == 0 else index))
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": tool_result(result_rng, size)}
        )
    messages.append(
        {
            "role": "assistant",
            "content": rng.choice(
                [
                    "I found the order and refunded the duplicate charge; the carrier shows it "
                    "was returned to the warehouse, so I have also started a reshipment.",
                    "Your order is delayed at the carrier. I cannot refund yet, sorry.",
                    "I refunded both charges.",
                    "Please contact your bank about the double charge.",
                ]
            ),
        }
    )
    return messages


def naive_prompt(message_lists: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """ART's RULER layout without its common-prefix dedup: each trajectory in full, as JSON."""
    body = "\n\n".join(
        f'<trajectory id="{k}">\n{json.dumps(messages)}\n</trajectory>'
        for k, messages in enumerate(message_lists, start=1)
    )
    tools = f"<tools>\n{json.dumps(TOOLS)}\n</tools>\n\n"
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(rubric=DEFAULT_RUBRIC)},
        {"role": "user", "content": f"{tools}Trajectories:\n\n{body}"},
    ]


def count_tokens(tokenizer: Any, messages: list[dict[str, Any]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


async def judge_twice(message_lists: list[list[dict[str, Any]]], cache_dir: Path) -> dict[str, Any]:
    """The same step judged twice by SmolLM2 on our backend: the second is served by the cache."""
    backend = art.LocalBackend(path=cache_dir / "art")
    model = art.TrainableModel(
        name="ruler-bench", project="bench", base_model="smollm2-135m-instruct"
    )
    await model.register(backend)
    judge = art.Model(name="smollm2-135m-instruct")
    await judge.register(backend)
    runs = []
    try:
        for _ in range(2):
            usage = art.JudgeUsage()
            started = time.perf_counter()
            await art.ruler(
                message_lists, judge, tools=TOOLS, cache=cache_dir / "cache", usage=usage,
                sampling={"temperature": 0.0},
            )  # fmt: skip
            runs.append({"seconds": time.perf_counter() - started, **usage.metrics(prefix="")})
    finally:
        await backend.close()
    return {"first_step": runs[0], "repeated_step": runs[1]}


def markdown(result: dict[str, Any]) -> str:
    ours, naive = result["ours"], result["naive"]
    lines = [
        START,
        "## RULER judge prompt: ours vs the naive layout (`benchmarks/ruler_prompt.py`)",
        "",
        "One group of 8 multi-turn tool-using trajectories (a shared system prompt with a long "
        "policy, 4 tools, the same first search call, 1-3 more tool calls with JSON results of "
        "up to ~6,000 characters, 4 distinct final answers). Naive: ART's RULER layout without "
        "its common-prefix dedup, every trajectory serialized in full as JSON. Ours: shared "
        "context once, identical runs merged, every message cut to 2,000 characters with a "
        "visible marker. Tokens counted with SmolLM2's tokenizer (chat template included).",
        "",
        "| layout | prompt tokens | characters | runs judged | messages cut |",
        "|---|---:|---:|---:|---:|",
        f"| naive | {naive['tokens']:,} | {naive['characters']:,} | {naive['runs']} | 0 |",
        f"| ours | {ours['tokens']:,} | {ours['characters']:,} | {ours['runs']} | "
        f"{ours['truncated_messages']} ({ours['truncated_chars']:,} chars) |",
        f"| ours, no cutting (budget 10^6) | {result['ours_untruncated']['tokens']:,} | "
        f"{result['ours_untruncated']['characters']:,} | {ours['runs']} | 0 |",
        "",
        f"**Ratio ours / naive: {result['ratio']:.2f}x** (target <= 0.5x: "
        f"{'met' if result['ratio'] <= 0.5 else 'MISSED'}). Without cutting, the dedup alone "
        f"gives {result['ratio_untruncated']:.2f}x.",
    ]
    if "cache" in result:
        first, again = result["cache"]["first_step"], result["cache"]["repeated_step"]
        lines += [
            "",
            "Cache, the same step judged twice by SmolLM2-135M-Instruct on our backend:",
            "",
            "| | requests | prompt tokens | completion tokens | cache hits | seconds |",
            "|---|---:|---:|---:|---:|---:|",
            f"| first step | {first['requests']:.0f} | {first['prompt_tokens']:.0f} | "
            f"{first['completion_tokens']:.0f} | {first['cache_hits']:.0f} | {first['seconds']:.1f} |",
            f"| repeated step | {again['requests']:.0f} | {again['prompt_tokens']:.0f} | "
            f"{again['completion_tokens']:.0f} | {again['cache_hits']:.0f} | {again['seconds']:.3f} |",
            "",
            f"SmolLM2's context is 8,192 tokens: the 2,000-character prompt "
            f"({ours['tokens']:,} tokens) overflowed, so RULER resent it with messages cut to "
            f"1,000 characters ({first['truncated_messages']:.0f} messages, "
            f"{first['truncated_chars']:,.0f} characters cut). The repeated step knows both "
            "from the cache and sends nothing.",
        ]
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-judge", action="store_true", help="count tokens only")
    parser.add_argument("--work", default="/tmp/ruler-prompt-bench")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from art_backend.testing import ensure_default_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    message_lists = [trajectory(i % 6) for i in range(8)]  # 6 distinct runs, 2 repeated
    prompt = build_judge_prompt(distinct_runs(message_lists, TOOLS))
    untruncated = build_judge_prompt(distinct_runs(message_lists, TOOLS), message_char_budget=10**6)
    naive = naive_prompt(message_lists)

    def size(messages: list[dict[str, Any]]) -> dict[str, int]:
        return {
            "tokens": count_tokens(tokenizer, messages),
            "characters": sum(len(m["content"]) for m in messages),
        }

    result: dict[str, Any] = {
        "trajectories": len(message_lists),
        "naive": {**size(naive), "runs": len(message_lists)},
        "ours": {
            **size(prompt.messages),
            "runs": prompt.num_runs,
            "truncated_messages": prompt.truncated_messages,
            "truncated_chars": prompt.truncated_chars,
        },
        "ours_untruncated": size(untruncated.messages),
    }
    result["ratio"] = result["ours"]["tokens"] / result["naive"]["tokens"]
    result["ratio_untruncated"] = result["ours_untruncated"]["tokens"] / result["naive"]["tokens"]
    if not args.skip_judge:
        work = Path(args.work) / time.strftime("%Y%m%d-%H%M%S")
        result["cache"] = asyncio.run(judge_twice(message_lists, work))
    publish(result, RESULTS, START, END, markdown(result))


if __name__ == "__main__":
    main()
