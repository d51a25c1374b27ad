"""A zero-change rollout: `RolloutCapture` (its URL, then its trajectory) and
`trajectory_from_records`, which turns the server's recorded completions back into a
`Trajectory` with the exact choices that were sampled.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from openai.types.chat.chat_completion import Choice

from art_core._backend import Backend, new_rollout_id
from art_core._strict import check_names
from art_core._trajectory import History, Trajectory

logger = logging.getLogger("art_core.model")


class CapturedModel(Protocol):
    """What a capture reads of the model it runs (a `TrainableModel`; named here so this module
    need not import `_model`, which imports it)."""

    @property
    def backend(self) -> Backend: ...

    def get_inference_name(self, step: int | None = None) -> str: ...


class RolloutCapture:
    """The scope of one zero-change rollout: its URL, and afterwards its trajectory.

    Set `reward`, and fill `metrics` and `metadata`, inside the block; any other attribute
    (`r.rewrd = 1`) raises `UnknownFieldError` rather than being silently dropped.
    """

    _ATTRIBUTES = frozenset(
        {
            "trainable_model",
            "id",
            "model",
            "base_url",
            "api_key",
            "_backend",
            "_trajectory",
            "reward",
            "metrics",
            "metadata",
        }
    )

    def __init__(self, model: CapturedModel) -> None:
        self.trainable_model = model
        self.id = new_rollout_id()
        self.model = model.get_inference_name()
        self.base_url = model.backend.rollout_base_url(self.id)
        self.api_key = model.backend.api_key or "unused"
        self._backend = model.backend
        self._trajectory: Trajectory | None = None
        self.reward = 0.0
        self.metrics: dict[str, float | int | bool] = {}
        self.metadata: dict[str, Any] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._ATTRIBUTES:
            # The message lists what a rollout sets; the rest are read-only in spirit.
            check_names(
                "RolloutCapture", [name], ["reward", "metrics", "metadata"], noun="attribute"
            )
        super().__setattr__(name, value)

    @property
    def trajectory(self) -> Trajectory:
        if self._trajectory is None:
            raise RuntimeError("the trajectory is assembled when the `async with` block exits")
        return self._trajectory

    async def collect(self) -> Trajectory:
        """Assemble the trajectory from every completion the server recorded for this rollout."""
        records = await self._backend.rollout_records(self.id)
        self._trajectory = trajectory_from_records(
            records,
            reward=self.reward,
            metrics=self.metrics,
            metadata={**self.metadata, "rollout_id": self.id},
        )
        return self._trajectory

    async def fail(self, error: BaseException) -> None:
        """The run raised: keep its calls so far on `error` (for review), release the records."""
        try:
            records = await asyncio.wait_for(self._backend.rollout_records(self.id), 10)
            partial = trajectory_from_records(
                records, reward=0.0, metadata={**self.metadata, "rollout_id": self.id}
            )
            await asyncio.wait_for(self._backend.discard_rollout(self.id), 10)
        except Exception as cleanup_error:  # noqa: BLE001 - the run's own error is what matters
            # The records stay on the server until they expire (counted on its /metrics).
            logger.warning("rollout %s: could not release its records: %s", self.id, cleanup_error)
            return
        error.art_trajectory = partial  # type: ignore[attr-defined]
        error.add_note(
            f"art: rollout {self.id} ended by {type(error).__name__} after "
            f"{len(records)} recorded call(s); not trained (its calls are kept on the exception)."
        )


def trajectory_from_records(records: list[dict[str, Any]], **fields: Any) -> Trajectory:
    """A trajectory from a rollout's recorded completions, in call order.

    A call whose messages extend an earlier history (same messages, then that call's answer,
    then more) joins it; any other call starts an additional history. Choice 0 is the turn kept;
    other choices (n > 1) are counted in `metrics["dropped/unused_choices"]`.
    """
    histories: list[list[Any]] = []
    tools_of: list[list[dict[str, Any]] | None] = []
    unused_choices = 0
    for record in records:
        messages = list(record["request"].get("messages", []))
        # With n > 1 the agent went on with one choice; the others did not lead to the reward.
        unused_choices += len(record["choices"]) - 1
        choice_data = min(record["choices"], key=lambda c: c["index"])
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


def _message_dict(choice: Choice) -> dict[str, Any]:
    return choice.message.model_dump(exclude_none=True)


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
