"""A `.art` folder written the way the trainer writes it, for the review page's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from art_backend.testing import ModelStore

PROJECT, MODEL = "shop", "agent-1"


def tool_trajectory(trajectory_id: str, reward: float, answer: str, **extra: Any) -> dict:
    """A logged row: a tool-calling conversation with a judge's explanation in its logs."""
    return {
        "id": trajectory_id,
        "reward": reward,
        "metrics": {"num_turns": 2.0, "tool_calls": 1.0},
        "metadata": {"scenario": "stock"},
        "logs": [f"RULER: run {trajectory_id} answered {answer}", "finished"],
        "histories": [
            {
                "messages": [
                    {"role": "system", "content": "You run a coffee shop's inventory."},
                    {"role": "user", "content": "How many bags of Kenya AA are left?"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": f"call-{trajectory_id}",
                                "type": "function",
                                "function": {
                                    "name": "get_item",
                                    "arguments": '{"name": "Kenya AA"}',
                                },
                            }
                        ],
                    },
                    {
                        "role": "tool",
                        "tool_call_id": f"call-{trajectory_id}",
                        "content": "stock: 12",
                    },
                    {"role": "assistant", "content": answer},
                ],
                "tools": None,
                "turns": [],
            }
        ],
        "context_assistant_messages": 0,
        **extra,
    }


def write_review_store(root: Path) -> ModelStore:
    """Two train steps (0, 1) and one val log: groups with tool calls, an exception, metrics."""
    store = ModelStore(root, PROJECT, MODEL)
    step0 = [
        {"group": 0, **tool_trajectory("t0-a", 1.0, "12 bags <script>x</script>", advantage=1.2)},
        {"group": 0, **tool_trajectory("t0-b", 0.0, "I do not know", advantage=-1.2)},
        {"group": 1, **tool_trajectory("t0-c", 0.5, "About a dozen", advantage=0.7)},
        {"group": 1, **tool_trajectory("t0-d", 0.25, "Twelve", advantage=-0.7)},
        {"group": 1, "exception": "TimeoutError: the tool took too long"},
    ]
    step1 = [
        {"group": 0, **tool_trajectory("t1-a", 0.9, "12 bags left", advantage=0.7)},
        {"group": 0, **tool_trajectory("t1-b", 0.1, "Out of stock", advantage=-0.7)},
    ]
    store.write_trajectories("train", 0, step0)
    store.write_trajectories("train", 1, step1)
    store.write_trajectories("val", 2, [{"group": 0, **tool_trajectory("v-a", 0.8, "12")}])
    for step, reward in ((1, 0.4375), (2, 0.5)):
        store.append_history(
            {
                "type": "train",
                "step": step,
                "metrics": {"reward": reward, "loss": 0.1 * step, "entropy": 2.0 - step / 10},
            }
        )
    store.append_history({"type": "log", "split": "val", "step": 2, "metrics": {"reward": 0.8}})
    return store


def start_review_server(root: Path, *, api_key: str | None = None):
    """`art review`'s app over `root` on a free 127.0.0.1 port, in a thread."""
    from art_backend.review.cli import build_review_server
    from tests.support.servers import serve_in_thread

    return serve_in_thread(build_review_server(root, api_key=api_key))
