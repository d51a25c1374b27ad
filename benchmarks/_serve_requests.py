"""The serving benchmark's workload (its prompts) and its three kinds of request: one chat
completion, N of them at once, and one streamed (time to first token, decode tokens/s)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _serve_settings import REQUEST_TIMEOUT

TOPICS = [
    "a lighthouse keeper who finds a message in a bottle",
    "a dragon who is afraid of the dark",
    "a robot learning to bake bread",
    "two friends crossing a desert on camels",
    "a detective solving a mystery on a train",
    "a girl who can talk to trees",
    "a pirate ship lost in a storm",
    "an astronaut stranded on the moon",
    "a small village preparing for a winter festival",
    "a cat who becomes the mayor of a town",
    "a young wizard failing his first exam",
    "a musician who loses her voice",
    "a farmer who discovers a hidden cave",
    "a knight searching for a lost crown",
    "a boy who builds a time machine in his garage",
    "a family of foxes moving to the city",
]
PROMPTS = [f"Write a long story about {topic}." for topic in TOPICS]
SINGLE_PROMPT = "Write a long story about a old clockmaker and his apprentice."


def chat_messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


async def one_request(client: Any, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    response = await client.chat.completions.create(
        model=model,
        messages=chat_messages(prompt),
        max_tokens=max_tokens,
        temperature=0,
    )
    usage = response.usage
    return {
        "completion_tokens": usage.completion_tokens if usage else None,
        "finish_reason": response.choices[0].finish_reason,
        "text": response.choices[0].message.content or "",
    }


async def concurrent_run(client: Any, model: str, prompts: list[str], max_tokens: int) -> dict:
    started = time.perf_counter()
    results = await asyncio.wait_for(
        asyncio.gather(*(one_request(client, model, p, max_tokens) for p in prompts)),
        REQUEST_TIMEOUT,
    )
    wall = time.perf_counter() - started
    tokens = [r["completion_tokens"] for r in results]
    if any(t is None for t in tokens):
        raise RuntimeError("a response has no usage.completion_tokens")
    total = sum(tokens)
    return {
        "wall_seconds": round(wall, 3),
        "completion_tokens": total,
        "tokens_per_request": tokens,
        "finish_reasons": sorted({r["finish_reason"] for r in results}),
        "tokens_per_second": round(total / wall, 2),
    }


async def streamed_run(client: Any, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed request: time to first content token and decode tokens/s after it."""
    started = time.perf_counter()
    first = last = None
    chunks = 0
    usage_tokens = None
    stream = await client.chat.completions.create(
        model=model,
        messages=chat_messages(prompt),
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async with asyncio.timeout(REQUEST_TIMEOUT):
        async for chunk in stream:
            if chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].delta.content:
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    if first is None:
        raise RuntimeError("the stream carried no content")
    tokens = usage_tokens if usage_tokens is not None else chunks
    decode_seconds = last - first
    return {
        "ttft_seconds": round(first - started, 4),
        "completion_tokens": tokens,
        "tokens_from": "usage" if usage_tokens is not None else "content chunks",
        "content_chunks": chunks,
        "decode_tokens_per_second": round((tokens - 1) / decode_seconds, 2)
        if decode_seconds > 0 and tokens > 1
        else None,
        "total_seconds": round(time.perf_counter() - started, 3),
    }
