"""Chats through an art-server from a namespace host, as an agent's OpenAI client sends them:
`python -m tests.netns._chat_driver JSON` prints one JSON line, its answer.

Each chat is a rollout of its own (`/rollouts/<id>/v1`) of `turns` turns, `concurrency` at a
time, with the client's own retries (a 503 from a replica taken out is retried, as the OpenAI
SDK does): `count` chats, or fewer once the file `stop` exists. With `progress`, a line is
appended to that file per chat answered (a test pulls a cable meanwhile). The answer counts
chats answered and failed, how many of the answered ones the server recorded under their
rollout, the replicas' states and the routing counters (`art_replica_follow_up_*`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai


async def chats(spec: dict[str, Any]) -> dict[str, Any]:
    server, key = spec["server"], spec["key"]
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server, headers=headers, timeout=30) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        run = uuid.uuid4().hex[:6]
        progress = Path(spec["progress"]) if spec.get("progress") else None
        stop = Path(spec["stop"]) if spec.get("stop") else None
        failed: list[str] = []
        answered: list[str] = []
        numbers = iter(range(spec["count"]))
        started = time.perf_counter()

        async def chat(index: int) -> None:
            rollout_id = f"{run}-{index}"
            client = openai.AsyncOpenAI(
                base_url=f"{server}/rollouts/{rollout_id}/v1",
                api_key=key,
                max_retries=spec.get("retries", 4),
                timeout=120,
            )
            messages: list[Any] = [{"role": "user", "content": f"Tell story {index}."}]
            try:
                for _ in range(spec.get("turns", 1)):  # each turn sees the ones before
                    response = await client.chat.completions.create(
                        model=model, messages=messages, max_tokens=spec.get("max_tokens", 32)
                    )
                    reply = response.choices[0].message.content or ""
                    messages += [
                        {"role": "assistant", "content": reply},
                        {"role": "user", "content": "Go on."},
                    ]
            except openai.APIError as error:
                failed.append(f"{type(error).__name__}: {error}")
                return
            answered.append(rollout_id)
            if progress is not None:
                with progress.open("a") as marks:
                    marks.write(f"{rollout_id}\n")

        async def worker() -> None:
            for index in numbers:
                if stop is not None and stop.exists():
                    return
                await chat(index)

        await asyncio.gather(*(worker() for _ in range(spec.get("concurrency", 3))))
        seconds = time.perf_counter() - started
        recorded = 0
        for rollout_id in answered:
            rollout = (await http.get(f"/v1/rollouts/{rollout_id}")).json()
            recorded += bool(rollout["completions"])
        health = (await http.get("/health")).json()
        metrics = (await http.get("/metrics")).text.splitlines()
    return {
        "answered": len(answered),
        "failed": failed,
        "recorded": recorded,
        "seconds": seconds,
        "replicas": health.get("replicas", []),
        "routing": {
            name: float(value)
            for name, value in (
                line.split() for line in metrics if line.startswith("art_replica_f")
            )
        },
    }


if __name__ == "__main__":
    try:
        answer = asyncio.run(chats(json.loads(sys.argv[1])))
    except BaseException as error:  # noqa: BLE001 - the test reads the traceback
        answer = {"crashed": type(error).__name__, "traceback": traceback.format_exc()}
    print(json.dumps(answer), flush=True)
