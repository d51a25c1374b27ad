"""The scripted policy of the MCP rollout benchmark, in a process of its own.

    python benchmarks/_scripted_policy.py [--delay SECONDS]

Starts the test suite's scripted OpenAI-compatible server (`tests/support/scripted_judge.py`, real
HTTP on 127.0.0.1) with a fixed policy, prints its base URL on one line, and serves until its
standard input closes. The policy decides by the number of tool results in the conversation:
search_items, get_item, low_stock_report, then complete_task. A process of its own, so that the
policy's work does not share the benchmark's interpreter (its GIL and event loop).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.scripted_judge import Reply, call, start_scripted_judge

TURNS = [
    ("search_items", {"query": "coffee", "max_results": 10}),
    ("get_item", {"sku": "COF-003"}),
    ("low_stock_report", {"threshold": 5}),
]
TOOL_CALLS_PER_ROLLOUT = len(TURNS)
POLICY_CALLS_PER_ROLLOUT = len(TURNS) + 1  # the last turn calls complete_task


def fixed_policy(delay: float) -> Any:
    """The reply to a request body: the next tool of TURNS, then complete_task."""

    def reply(body: dict[str, Any]) -> Reply:
        done = sum(message.get("role") == "tool" for message in body["messages"])
        if done < len(TURNS):
            turn = call(*TURNS[done])
        else:
            turn = call("complete_task", {"summary": "Brazil Cerrado (COF-003) has 3 left."})
        turn.delay = delay
        return turn

    return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    args = parser.parse_args()
    judge, server, _thread = start_scripted_judge()
    judge.default = fixed_policy(args.delay)
    print(judge.url, flush=True)
    sys.stdin.read()  # until the benchmark closes our standard input (or exits)
    server.should_exit = True


if __name__ == "__main__":
    main()
