"""A rollout's trajectory from the server's records: `trajectory_from_records` turns a rollout's
recorded completions back into a `Trajectory` with the exact choices that were sampled (used by
`model.rollout()` and the capture scopes).
"""

from __future__ import annotations

import logging
from typing import Any

from openai.types.chat.chat_completion import Choice
from openai.types.completion_choice import CompletionChoice

from art_core.trajectories import History, Trajectory

logger = logging.getLogger("art_core.model")


def trajectory_from_records(records: list[dict[str, Any]], **fields: Any) -> Trajectory:
    """A trajectory from a rollout's recorded completions, in call order.

    A call whose messages extend an earlier history (same messages, then that call's answer,
    then more) joins it; any other call starts an additional history. Choice 0 is the turn kept;
    other choices (n > 1) are counted in `metrics["dropped/unused_choices"]`. A plain-text
    completion (`/v1/completions`) is a history of its own: its prompt as a user message (empty
    when it was token ids), then its `CompletionChoice`.
    """
    histories: list[list[Any]] = []
    tools_of: list[list[dict[str, Any]] | None] = []
    unused_choices = 0
    for record in records:
        messages = list(record["request"].get("messages", []))
        # With n > 1 the agent went on with one choice; the others did not lead to the reward.
        unused_choices += len(record["choices"]) - 1
        choice_data = min(record["choices"], key=lambda c: c["index"])
        choice: Choice | CompletionChoice
        if record.get("object") == "text_completion":
            messages = [{"role": "user", "content": _first_prompt_text(record["request"])}]
            choice = CompletionChoice.model_validate(
                {
                    "index": choice_data["index"],
                    "text": choice_data["text"],
                    "finish_reason": choice_data["finish_reason"],
                    "completion_id": record["id"],
                }
            )
        else:
            choice = Choice.model_validate(
                {
                    "index": choice_data["index"],
                    "message": choice_data["message"],
                    "finish_reason": choice_data["finish_reason"],
                    "completion_id": record["id"],
                }
            )
        target = None
        for index, history in enumerate(histories):
            plain = [item if isinstance(item, dict) else _message_dict(item) for item in history]
            if len(messages) > len(plain) and all(
                _same_message(a, b) for a, b in zip(messages, plain, strict=False)
            ):
                target = index
        if target is None:
            histories.append([*messages, choice])
            tools_of.append(record["request"].get("tools"))
        else:
            done = len(histories[target])
            histories[target] += [*messages[done:], choice]
    if unused_choices:
        logger.warning(
            "rollout %s: %d extra choice(s) of n > 1 calls are not trained (the run went on "
            "with choice 0); counted in metrics['dropped/unused_choices']",
            fields.get("metadata", {}).get("rollout_id"),
            unused_choices,
        )
        fields["metrics"] = {**fields.get("metrics", {}), "dropped/unused_choices": unused_choices}
    if not histories:
        return Trajectory(messages_and_choices=[], **fields)
    first, *rest = histories
    return Trajectory(
        messages_and_choices=first,
        tools=tools_of[0],
        additional_histories=[
            History(messages_and_choices=h, tools=t)
            for h, t in zip(rest, tools_of[1:], strict=True)
        ],
        **fields,
    )


def _message_dict(choice: Choice | CompletionChoice) -> dict[str, Any]:
    if isinstance(choice, CompletionChoice):
        return {"role": "assistant", "content": choice.text}
    return choice.message.model_dump(exclude_none=True)


def _first_prompt_text(request: dict[str, Any]) -> str:
    """A completion request's first prompt as text ("" when it was token ids)."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else ""


def _same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal as a conversation turn: role, text, and tool calls (ids and null fields ignored)."""

    def key(message: dict[str, Any]) -> tuple[Any, ...]:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        calls = tuple(
            (call.get("function", {}).get("name"), call.get("function", {}).get("arguments"))
            for call in message.get("tool_calls") or []
        )
        return message.get("role"), content, calls

    return key(a) == key(b)
