"""A scripted OpenAI-compatible judge (or policy) on 127.0.0.1, for the exact cases a real model
cannot produce on demand: it answers from a script (a JSON text, tool calls, an HTTP status, a
delay) and records
every request it receives. It speaks the real chat-completions wire format, so the code under
test uses the real `openai` client over real HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.support.servers import serve_in_thread


@dataclass
class Reply:
    """One scripted answer: `content` as the message text, or an HTTP `status` error; after
    `delay` seconds. `usage` is (prompt_tokens, completion_tokens)."""

    content: str = ""
    status: int = 200
    delay: float = 0.0
    usage: tuple[int, int] = (100, 20)
    finish_reason: str = "stop"
    message: str = ""  # the error message of a non-200 reply
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, JSON arguments)


def call(name: str, arguments: str | dict[str, Any] | None = None) -> Reply:
    """A scripted tool call (a policy's turn): `arguments` as a dict, or raw text as sent."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return Reply(tool_calls=[(name, raw)], finish_reason="tool_calls")


def scores_json(*scores: float, explanation: str = "ok") -> str:
    """A RULER answer for runs 1..N: scores given in [0, 1], written as the judge's 0..100."""
    return json.dumps(
        {
            f"run_{k}": {"explanation": explanation, "score": round(s * 100, 6)}
            for k, s in enumerate(scores, 1)
        }
    )


@dataclass
class ScriptedJudge:
    url: str
    script: list[Reply] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    # When the script is empty: a fixed Reply, or a function of the request body.
    default: Reply | Callable[[dict[str, Any]], Reply] | None = None

    def queue(self, *replies: Reply | str) -> None:
        self.script.extend(r if isinstance(r, Reply) else Reply(r) for r in replies)

    def reset(self) -> None:
        self.script.clear()
        self.requests.clear()
        self.default = None

    def user_prompt(self, index: int = -1) -> str:
        return self.requests[index]["messages"][-1]["content"]


def _app(judge: ScriptedJudge) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        judge.requests.append(body)
        reply = judge.script.pop(0) if judge.script else judge.default
        if callable(reply):
            reply = reply(body)
        if reply is None:
            return JSONResponse({"error": {"message": "script exhausted"}}, status_code=418)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return JSONResponse(
                {"error": {"message": reply.message or f"scripted {reply.status}"}},
                status_code=reply.status,
            )
        return JSONResponse(
            {
                "id": f"chatcmpl-{len(judge.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": _message(reply),
                        "finish_reason": reply.finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": reply.usage[0],
                    "completion_tokens": reply.usage[1],
                    "total_tokens": sum(reply.usage),
                },
            }
        )

    return app


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{k}", "type": "function", "function": {"name": n, "arguments": a}}
            for k, (n, a) in enumerate(reply.tool_calls)
        ]
    else:
        message["content"] = reply.content
    return message


def start_scripted_judge() -> tuple[ScriptedJudge, uvicorn.Server, threading.Thread]:
    judge = ScriptedJudge("")
    server, thread, url = serve_in_thread(_app(judge))
    judge.url = f"{url}/v1"
    return judge, server, thread


def responder(body: dict[str, Any], counter=itertools.count()) -> Reply:
    """A default script: scenarios when asked for scenarios; otherwise scores favouring later runs."""
    schema = body["response_format"]["json_schema"]
    if schema["name"] == "scenarios":
        count = schema["schema"]["properties"]["scenarios"]["minItems"]
        tasks = [
            {"task": f"Question {next(counter)}: when do you open on day {i}?", "difficulty": 2,
             "expected": None}
            for i in range(count)
        ]  # fmt: skip
        return Reply(json.dumps({"scenarios": tasks}))
    runs = len(schema["schema"]["required"])
    return Reply(scores_json(*[(k + 1) / runs for k in range(runs)]))
