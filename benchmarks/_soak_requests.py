"""The one expensive request of the soak's phase 3, built before the clients start.

Chat requests at and past the server's limits (`expensive_requests`), issue 43's hostile shapes
(`hostile_requests`: escapes, a 32 MB history, a 50,000-key client_metrics) and issue 50's
hostile Tinker bodies (`tinker_requests`: JSON to create_session, protobuf to forward_backward,
written by `tests/support/tinker_bodies.py`). Each is a `Request`, sent as it is.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's tests/

from tests.support import tinker_bodies as wire

MODEL = "tiny"
MIB = 1024 * 1024
REQUEST_TIMEOUT = 120.0
JSON, PROTOBUF = "application/json", "application/x-protobuf"


@dataclass(frozen=True)
class Request:
    """One request as it goes on the wire."""

    method: str
    path: str
    body: bytes
    content_type: str = JSON


def post(path: str, body: Any) -> Request:
    """A JSON POST (encoded now, not while the clients run: json.dumps of 6 million values holds
    the soak's own event loop for a second, which would read as the server's latency)."""
    return Request("POST", path, json.dumps(body).encode())


def expensive_requests() -> dict[str, Request]:
    """The one-off chat requests of phase 3 (built once: the 8 MB one is large)."""
    count = 5_000  # MAX_SCHEMA_PROPERTIES: the largest schema the server compiles
    prefix = secrets.token_hex(3)  # new to the server: compiled grammars are cached
    properties = {f"{prefix}_{i}": {"type": "string"} for i in range(count)}
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    # Long property names: a 9 MB tool once passed the character check and took 34.5 s.
    named = {f"{prefix}{i}_" + "n" * 900: {"type": "string"} for i in range(10_000)}
    bodies = {
        "8 MB message": chat(content="word " * (8 * MIB // 5)),
        "5,000-property JSON schema": chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "big", "schema": schema},
            }
        ),
        "33 MiB body": chat(metadata={"notes": "n" * (33 * MIB)}),
        "6 million small values (16 MB)": chat(
            tools=[function_tool({"type": "object", "enum": [[1, 2, 3]] * 1_500_000})]
        ),
        "9 MB of tool property names": chat(
            tools=[function_tool({"type": "object", "properties": named})]
        ),
    }
    return {label: post("/v1/chat/completions", body) for label, body in bodies.items()}


# 9.3 million escapes in one string: parsing it held every route 0.7-1.3 s (issue 43).
ESCAPES = '\\",' * (28 * 1_000_000 // 3)
TRAINED = ("soak", "hostile")  # the model the training-route cases name
HISTORY_MB = 32
ESCAPES_CHAT, ESCAPES_PROMOTE = (
    f'28 MB of `\\",` escapes, {route}' for route in ("chat", "promote")
)
HISTORY_GET, CLIENT_METRICS = f"GET of a {HISTORY_MB} MB history", "50,000-key client_metrics"


def hostile_requests(url: str, art_path: Path) -> dict[str, Request]:
    """Issue 43's hostile shapes: built once the model they name is registered and its history
    grown to HISTORY_MB (written into the store's file directly)."""
    project, name = TRAINED
    base = f"/v1/training/models/{project}/{name}"
    response = httpx.post(
        f"{url}/v1/training/models",
        json={"project": project, "name": name, "base_model": MODEL},
        timeout=REQUEST_TIMEOUT,
    )
    response.raise_for_status()
    row = json.dumps({"type": "log", "step": 0, "split": "val", "metrics": {"pad": 0.0},
                      "note": "n" * 4_000})  # fmt: skip
    history = art_path / project / "models" / name / "history.jsonl"
    with history.open("a") as rows:
        rows.write((row + "\n") * (HISTORY_MB * MIB // (len(row) + 1)))
    prefix = f'{{"model": "{MODEL}", "max_tokens": 4, "messages": [{{"role": "user", "content": "'
    metrics = {f"client/metric_{index}": 1.0 for index in range(50_000)}
    # A group that trains (two recorded turns): a server without the bound runs the step.
    trajectories = []
    for index in range(2):
        answer = httpx.post(f"{url}/v1/chat/completions", json=chat(), timeout=60).json()
        turns = [{"completion_id": answer["id"]}]
        trajectories.append(
            {"id": f"t{index}", "reward": float(index), "histories": [{"turns": turns}]}
        )
    train = {"groups": [{"trajectories": trajectories}], "client_metrics": metrics}
    return {
        ESCAPES_CHAT: Request("POST", "/v1/chat/completions", (prefix + ESCAPES + '"}]}').encode()),
        ESCAPES_PROMOTE: Request(
            "POST", f"{base}/promote",
            ('{"step": 0, "details": {"note": "' + ESCAPES + '"}}').encode(),
        ),
        HISTORY_GET: Request("GET", f"{base}/history", b""),
        CLIENT_METRICS: post(f"{base}/train", train),
    }  # fmt: skip


def chat(content: str = "hi", **fields: Any) -> dict[str, Any]:
    """A chat request body of one user message, 4 tokens at most, with `fields` added."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        **fields,
    }


def function_tool(parameters: dict[str, Any]) -> dict[str, Any]:
    """A function tool named `f` with these parameters."""
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


TINKER = "/api/v1"


def tinker_requests(url: str) -> dict[str, Request]:
    """Issue 50's hostile Tinker bodies: two to create_session (JSON), three to forward_backward
    (protobuf, aimed at a training run made here; no seq_id, so none waits for a turn)."""
    model_id = tinker_run(url)
    create_session = f"{TINKER}/create_session"
    values = {"tags": [], "sdk_version": "0.38.0", "user_metadata": {"v": [[1, 2, 3]] * 1_500_000}}
    escapes = '{"tags": [], "sdk_version": "' + ESCAPES + '"}'
    long_tokens = np.arange(1_500_000) % 100
    long_datum = wire.datum(long_tokens, {"target_tokens": wire.tensor(long_tokens, wire.INT64)})
    rows = 2_500_000  # every row empty: the row starts alone are 20 MB
    sparse = wire.sparse_tensor([], np.zeros(rows + 1), [], [rows, 1])
    sparse_datum = wire.datum(
        [3], {"target_tokens": wire.tensor([4], wire.INT64), "weights": sparse}
    )
    one_token = wire.datum([3], {"target_tokens": wire.tensor([4], wire.INT64)})

    def forward_backward(data: list[bytes]) -> Request:
        body = wire.forward_backward(model_id, 0, data, "cross_entropy")
        return Request("POST", f"{TINKER}/forward_backward", body, PROTOBUF)

    return {
        "Tinker create_session, 6 million small values": post(create_session, values),
        'Tinker create_session, 28 MB of `\\",` escapes': Request(
            "POST", create_session, escapes.encode()
        ),
        "Tinker forward_backward, one 1.5M-token datum": forward_backward([long_datum]),
        "Tinker forward_backward, a sparse tensor of 2.5M rows": forward_backward([sparse_datum]),
        "Tinker forward_backward, 400,000 one-token datums": forward_backward(
            [one_token] * 400_000
        ),
    }


def tinker_run(url: str) -> str:
    """A Tinker training run on the server (a session, then create_model's future): its id."""
    with httpx.Client(base_url=f"{url}{TINKER}", timeout=REQUEST_TIMEOUT) as http:
        session = http.post("/create_session", json={"tags": [], "sdk_version": "0.38.0"})
        model = {"session_id": session.json()["session_id"], "model_seq_id": 0}
        model |= {"base_model": MODEL, "lora_config": {"rank": 4}}
        future = http.post("/create_model", json=model).json()
        return str(settled(http, future["request_id"])["model_id"])


def settled(http: httpx.Client, request_id: str, wait: float = 600.0) -> dict[str, Any]:
    """A Tinker future's JSON answer once the operation is done (`{"type": "still running"}`
    after `wait` seconds)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        answer = http.post("/retrieve_future", json={"request_id": request_id})
        answer.raise_for_status()
        if answer.headers["content-type"].startswith(PROTOBUF):
            return {"type": "protobuf"}
        body: dict[str, Any] = answer.json()
        if body.get("type") != "try_again":
            return body
        time.sleep(0.1)
    return {"type": "still running"}
