"""An oracle RULER judge: an OpenAI-compatible server on 127.0.0.1 that scores by hidden ground truth.

No competent judge fits on a laptop CPU, so to prove that RULER's scores reach the gradient the
right way round this server stands in for one. It speaks the chat-completions wire protocol
(`POST /v1/chat/completions`, `GET /v1/models`, `response_format` with a JSON schema honoured),
so the stock `openai` SDK and `art.ruler_score_group` talk to it unchanged. It reads RULER's own
prompt (`art_core/rewards/_ruler_prompt.py`): the shared `<context>` and each `<run id="k">`, scores
each run with `truth(context, run)` (a code check the policy never sees), and answers with the
schema's keys `run_1..run_N`, each `{"explanation", "score": 0..100}`.

Like a real judge it can be wrong, in two measured ways:

- `noise`: each run's score is, with this probability, replaced by a uniform random 0..100;
- `tie_rate`: with this probability the whole group gets one score (the judge could not tell
  the runs apart): a tied group teaches GRPO nothing.

`invert=True` scores 100 - score: a judge that prefers the wrong runs (the tests use it to show
that the sign of the advantage follows the judge).

    with OracleJudge(truth, noise=0.25, tie_rate=0.1, seed=0) as judge:
        group = await art.ruler_score_group(group, judge.model(), cache=False)
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import art_core as art

Truth = Callable[[str, str], float]  # (shared context text, one run's text) -> 0..1

_CONTEXT = re.compile(r"<context>\n(.*?)\n</context>", re.DOTALL)
_RUN = re.compile(r'<run id="(\d+)">\n(.*?)\n</run>', re.DOTALL)


class OracleRequestError(ValueError):
    """A request the oracle cannot answer (answered as HTTP 400 with this message)."""


@dataclass
class JudgedRun:
    """One run as the oracle judged it: its text, the hidden truth and the score it gave."""

    run_text: str
    truth: float
    score: int


@dataclass
class OracleStats:
    """What the oracle did so far: requests, groups tied on purpose, runs given a random score."""

    requests: int = 0
    groups: int = 0
    tied_groups: int = 0
    noisy_runs: int = 0
    runs: int = 0
    judged: list[list[JudgedRun]] = field(default_factory=list)


def last_assistant_text(run: str) -> str:
    """The text of the run's last `assistant: ...` message as RULER renders it ("" if none)."""
    # The last message runs to the end of the run; a reply may itself contain blank lines.
    marker = "assistant: "
    position = run.rfind("\n\n" + marker)
    if position >= 0:
        return run[position + 2 + len(marker) :]
    return run[len(marker) :] if run.startswith(marker) else ""


def parse_ruler_prompt(text: str) -> tuple[str, list[tuple[int, str]]]:
    """The shared context and the runs `(id, text)` of a RULER user prompt, in prompt order."""
    runs = [(int(number), body) for number, body in _RUN.findall(text)]
    if not runs:
        raise OracleRequestError(
            'The oracle judge answers RULER prompts only: no <run id="k"> section found in the '
            "user message (build it with art_core.rewards._ruler_prompt.build_judge_prompt)."
        )
    context = _CONTEXT.search(text)
    return (context.group(1) if context else ""), runs


class OracleJudge:
    """The oracle judge server; `start()`/`close()` or use it as a context manager."""

    def __init__(
        self,
        truth: Truth,
        *,
        noise: float = 0.0,
        tie_rate: float = 0.0,
        invert: bool = False,
        seed: int = 0,
        keep_judged: bool = False,
    ) -> None:
        """`truth(context, run) -> 0..1` is the hidden check; see the module docstring for the rest."""
        for name, value in (("noise", noise), ("tie_rate", tie_rate)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a probability from 0 to 1, got {value}")
        self.truth = truth
        self.noise = noise
        self.tie_rate = tie_rate
        self.invert = invert
        self.keep_judged = keep_judged
        self.stats = OracleStats()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, `http://127.0.0.1:<port>/v1`."""
        if self._server is None:
            raise RuntimeError("The oracle judge is not started: call start() or use `with`.")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def model(self) -> art.Model:
        """The judge as an `art.Model`, to pass as RULER's `judge`."""
        return art.Model(name="oracle-judge", base_url=self.base_url, api_key="oracle")

    def start(self) -> OracleJudge:
        """Listen on a free port of 127.0.0.1, in a daemon thread."""
        judge = self

        class Handler(_Handler):
            oracle = judge

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OracleJudge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def judge(self, prompt: str, keys: list[str] | None = None) -> dict[str, Any]:
        """The answer object for one RULER prompt: `run_k -> {explanation, score}`.

        `keys`: the run keys the request's schema requires; they must match the prompt's runs.
        """
        context, runs = parse_ruler_prompt(prompt)
        expected = [f"run_{number}" for number, _ in runs]
        if keys is not None and sorted(keys) != sorted(expected):
            raise OracleRequestError(
                f"The response schema asks for {keys} but the prompt shows runs {expected}."
            )
        truths = [min(1.0, max(0.0, float(self.truth(context, body)))) for _, body in runs]
        with self._lock:
            self.stats.requests += 1
            self.stats.groups += 1
            self.stats.runs += len(runs)
            tied = len(runs) > 1 and self._random.random() < self.tie_rate
            scores = []
            for value in truths:
                if self._random.random() < self.noise:
                    self.stats.noisy_runs += 1
                    scores.append(self._random.randint(0, 100))
                else:
                    scores.append(round(100 * value))
            if tied:
                self.stats.tied_groups += 1
                scores = [round(sum(scores) / len(scores))] * len(scores)
            if self.invert:
                scores = [100 - s for s in scores]
            if self.keep_judged:
                self.stats.judged.append(
                    [
                        JudgedRun(body, value, score)
                        for (_, body), value, score in zip(runs, truths, scores, strict=True)
                    ]
                )
        return {
            f"run_{number}": {
                "explanation": f"hidden check {value:.2f}" + (" (tied)" if tied else ""),
                "score": score,
            }
            for (number, _), value, score in zip(runs, truths, scores, strict=True)
        }


class _Handler(BaseHTTPRequestHandler):
    oracle: OracleJudge
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: one line per judgement would drown the training log

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": "oracle-judge", "object": "model", "created": 0, "owned_by": "oracle"}
            self._send(200, {"object": "list", "data": [model]})
        else:
            self._error(404, f"No route GET {self.path}: use POST /v1/chat/completions.")

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"No route POST {self.path}: use POST /v1/chat/completions.")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            self._send(200, self._complete(body))
        except (OracleRequestError, ValueError, TypeError, KeyError) as error:
            self._error(400, str(error))

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OracleRequestError('"messages" must be a non-empty list of chat messages.')
        # The RULER prompt is the first user message with runs (a re-ask appends after it).
        prompt = next(
            (
                m["content"]
                for m in messages
                if isinstance(m, dict)
                and m.get("role") == "user"
                and isinstance(m.get("content"), str)
                and "<run id=" in m["content"]
            ),
            None,
        )
        if prompt is None:
            raise OracleRequestError(
                'The oracle judge answers RULER prompts only: no user message with <run id="k">.'
            )
        keys = None
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_schema":
            schema = response_format.get("json_schema", {}).get("schema", {})
            keys = list(schema.get("required") or schema.get("properties", {}).keys())
        answer = json.dumps(self.oracle.judge(prompt, keys))
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // 4
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "oracle-judge"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(answer) // 4,
                "total_tokens": prompt_tokens + len(answer) // 4,
            },
        }

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status == 400 else "not_found_error"
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
