"""Training rows: a trajectory's recorded completions become padded token tensors for the trainer.

Pure functions, no model: recorded turns -> `Sequence`s (`build_sequences`) -> padded `Rows`
with drop counts (`pack_rows`) -> micro-batches under a token budget (`micro_batches`, its
grouping `longest_first_groups`).

Alignment convention (the trainer must use exactly this)
--------------------------------------------------------
Every per-token tensor is aligned with `input_ids`: position p describes token input_ids[p].

- trained_mask[p] is 1 when input_ids[p] was sampled by the model, 0 for context and padding.
- old_logprobs[p] is the sampler's log pi_old(input_ids[p] | input_ids[:p]); 0 where untrained.
- The new logprob at position p therefore comes from the logits at position p - 1:
      new_logprobs[:, p] = log_softmax(logits[:, p - 1])[labels[:, p]]
  where `labels` is input_ids (a Tinker datum's rows name their own, `Rows.target_ids`).
  `_logprobs.token_logprobs(logits, labels)` does this shift and returns a tensor aligned the
  same way (column 0 is 0). Position 0 is never trained: every turn has a non-empty prompt. The
  trainer calls the same function on logits of the trained window only (`first_column=`).

Then `_grpo.policy_loss(new_logprobs, rows.old_logprobs, rows.advantages, rows.trained_mask, ...)`
takes the tensors as they are. With micro-batches, compute the step's denominator once over all
rows, `_grpo.loss_denominator(rows.trained_mask, config)` (it is additive over micro-batches),
and pass it as `policy_loss(..., denominator=...)` for each micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from art_backend._errors import InvalidRequestError
from art_backend.engines._chat_templates import has_chat_template
from art_backend.engines._tool_calls import prepare_messages, template_supports_tools
from art_core.wire import SFTRequest

DROP_REASONS = ("no_trainable_tokens", "truncated", "over_length")


@dataclass(frozen=True)
class TurnRecord:
    """One sampled assistant turn, as recorded by the server: exact prompt and sampled ids."""

    prompt_token_ids: list[int]
    token_ids: list[int]  # the sampled ids, EOS included
    logprobs: list[float]  # one per sampled id, from the sampler
    finish_reason: str  # "stop" | "length" | "tool_calls"


@dataclass(frozen=True)
class TrajectoryTurns:
    """The recorded turns of one trajectory, in call order, with its advantage from its group."""

    trajectory_id: str
    group_id: int
    advantage: float
    turns: list[TurnRecord]


@dataclass(frozen=True)
class Sequence:
    """One token sequence of a trajectory; 1-D tensors aligned with input_ids (module docstring)."""

    input_ids: torch.Tensor  # long [T]
    trained_mask: torch.Tensor  # bool [T]
    old_logprobs: torch.Tensor  # float32 [T]
    advantage: float
    trajectory_id: str
    group_id: int
    truncated: bool  # a turn of this sequence finished with "length"

    def __len__(self) -> int:
        return int(self.input_ids.numel())


@dataclass(frozen=True)
class Rows:
    """The trainer's one row type: right-padded sequences, [rows, T] token tensors aligned with
    input_ids (module docstring), plus one advantage and group id per row.

    A GRPO or SFT row scores its next input tokens (`labels` is `input_ids`); a Tinker datum
    names its own (`target_ids`) and carries its loss inputs per token (`token_inputs`:
    "weights", "advantages", ... aligned the same way, 0 where nothing is scored).
    """

    input_ids: torch.Tensor  # long [R, T], padding 0
    attention_mask: torch.Tensor  # long [R, T], 1 on real tokens
    trained_mask: torch.Tensor  # bool [R, T]: the positions the loss scores
    old_logprobs: torch.Tensor  # float32 [R, T]
    advantages: torch.Tensor  # float32 [R]
    group_ids: torch.Tensor  # long [R]
    trajectory_ids: list[str]
    target_ids: torch.Tensor | None = None  # long [R, T]; None: the input tokens themselves
    token_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # float32 [R, T] each

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def lengths(self) -> torch.Tensor:
        """Real (unpadded) length of every row."""
        return self.attention_mask.sum(-1)

    @property
    def trained_tokens(self) -> int:
        """Trained tokens in all rows: the token_mean denominator of the step."""
        return int(self.trained_mask.sum())

    @property
    def labels(self) -> torch.Tensor:
        """The token scored at each position: `target_ids`, or the input tokens."""
        return self.input_ids if self.target_ids is None else self.target_ids

    def select(self, indices: list[int]) -> Rows:
        """These rows, in this order, with columns trimmed to their longest row."""
        index = torch.tensor(indices, dtype=torch.long)
        width = int(self.lengths[index].max()) if indices else 0
        return Rows(
            input_ids=self.input_ids[index, :width],
            attention_mask=self.attention_mask[index, :width],
            trained_mask=self.trained_mask[index, :width],
            old_logprobs=self.old_logprobs[index, :width],
            advantages=self.advantages[index],
            group_ids=self.group_ids[index],
            trajectory_ids=[self.trajectory_ids[i] for i in indices],
            target_ids=None if self.target_ids is None else self.target_ids[index, :width],
            token_inputs={name: t[index, :width] for name, t in self.token_inputs.items()},
        )


def turns_from_record(record: dict[str, Any]) -> list[TurnRecord]:
    """The turns of one recorded completion (`_records`): one per choice, in index order. A
    choice of a completion of several prompts (`/v1/completions`) names its own prompt."""
    choices = sorted(record["choices"], key=lambda choice: choice["index"])
    return [
        TurnRecord(
            prompt_token_ids=list(choice.get("prompt_token_ids", record["prompt_token_ids"])),
            token_ids=list(choice["token_ids"]),
            logprobs=list(choice["logprobs"]),
            finish_reason=choice["finish_reason"],
        )
        for choice in choices
    ]


# ------------------------------------------------------- plain-dict assistant turns, by text


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """A conversation turn as matching sees it: role, text (None and "" alike; text parts
    joined; surrounding whitespace ignored, since tutorial code keeps `content.strip()`) and
    tool calls (name, arguments); ids and other fields ignored. The tokens trained are always
    the recorded ones, whitespace included."""
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    calls = tuple(
        (
            (call.get("function") or {}).get("name"),
            (call.get("function") or {}).get("arguments"),
        )
        for call in message.get("tool_calls") or []
        if isinstance(call, dict)
    )
    return message.get("role"), str(content).strip(), calls


class RecordedAnswers:
    """The recorded completions, indexed by their answers, to train plain-dict assistant turns.

    Tutorial code often keeps an answer as `{"role": "assistant", "content": text}` rather than
    the `Choice`. Such a turn trains on the tokens of a completion this server recorded when that
    completion's request held the same conversation as the turn's history before it and its
    choice the same answer (`message_key`: text and tool calls). Among several, the one in the
    trajectory's own rollout wins, then one served by the model being trained (`name@step`:
    its logprobs are this policy's, not another adapter's or the base model's), then the
    newest. Anything else (an edited or stripped answer,
    a conversation that differs from what was sent) matches nothing: the caller counts it.
    """

    def __init__(self, records: Iterable[dict[str, Any]]) -> None:
        self._by_answer: dict[tuple[Any, ...], list[tuple[dict[str, Any], int]]] = {}
        for record in records:
            for number, choice in enumerate(record.get("choices", [])):
                if "message" not in choice:  # a plain-text completion: no conversation to match
                    continue
                message = choice["message"] or {}
                key = message_key({"role": "assistant", **message})
                self._by_answer.setdefault(key, []).append((record, number))

    def find(
        self,
        history: list[dict[str, Any]],
        answer: dict[str, Any],
        *,
        rollout_id: str | None = None,
        model_name: str | None = None,
    ) -> TurnRecord | None:
        """The recorded turn behind `answer`, given the messages before it, or None."""
        prompt = [message_key(message) for message in history]
        best: tuple[bool, bool, float] | None = None
        found: TurnRecord | None = None
        for record, number in self._by_answer.get(message_key(answer), []):
            sent = record.get("request", {}).get("messages", [])
            if len(sent) != len(prompt) or [message_key(m) for m in sent] != prompt:
                continue
            served = str(record.get("model", ""))
            rank = (
                rollout_id is not None and record.get("rollout_id") == rollout_id,
                model_name is not None and served.partition("@")[0] == model_name,
                float(record.get("recorded_at", 0.0)),
            )
            if best is None or rank > best:
                choice = record["choices"][number]
                best, found = (
                    rank,
                    TurnRecord(
                        prompt_token_ids=list(record["prompt_token_ids"]),
                        token_ids=list(choice["token_ids"]),
                        logprobs=list(choice["logprobs"]),
                        finish_reason=choice["finish_reason"],
                    ),
                )
        return found


@dataclass
class _OpenSequence:
    tokens: list[int]
    trained: list[bool]
    logprobs: list[float]
    truncated: bool


def build_sequences(trajectory: TrajectoryTurns) -> list[Sequence]:
    """One sequence per chain of turns that extend each other; all share the trajectory's advantage.

    Turn k extends a sequence when its prompt starts with that sequence's tokens (earlier prompt
    plus sampled ids, exactly); the prompt's remaining tokens (tool results, user turns) are
    context. A turn that extends no sequence (rewritten history, parallel branch) starts one.
    """
    sequences: list[_OpenSequence] = []
    for number, turn in enumerate(trajectory.turns):
        _check_turn(turn, trajectory.trajectory_id, number)
        prompt = turn.prompt_token_ids
        # The longest sequence the prompt extends: a branch interleaved with other calls (a
        # sub-agent, a parallel sample) still continues its own sequence.
        extended = [s for s in sequences if prompt[: len(s.tokens)] == s.tokens]
        if extended:
            sequence = max(extended, key=lambda s: len(s.tokens))
        else:
            sequence = _OpenSequence(tokens=[], trained=[], logprobs=[], truncated=False)
            sequences.append(sequence)
        context = prompt[len(sequence.tokens) :]
        sequence.tokens += [*context, *turn.token_ids]
        sequence.trained += [False] * len(context) + [True] * len(turn.token_ids)
        sequence.logprobs += [0.0] * len(context) + list(turn.logprobs)
        sequence.truncated = sequence.truncated or turn.finish_reason == "length"
    return [
        Sequence(
            input_ids=torch.tensor(s.tokens, dtype=torch.long),
            trained_mask=torch.tensor(s.trained, dtype=torch.bool),
            old_logprobs=torch.tensor(s.logprobs, dtype=torch.float32),
            advantage=trajectory.advantage,
            trajectory_id=trajectory.trajectory_id,
            group_id=trajectory.group_id,
            truncated=s.truncated,
        )
        for s in sequences
    ]


def _check_turn(turn: TurnRecord, trajectory_id: str, number: int) -> None:
    where = f"trajectory {trajectory_id!r}, turn {number}"
    if not turn.prompt_token_ids:
        raise ValueError(f"{where}: empty prompt_token_ids; a sampled token needs a context")
    if len(turn.logprobs) != len(turn.token_ids):
        raise ValueError(
            f"{where}: {len(turn.token_ids)} token_ids but {len(turn.logprobs)} logprobs; "
            "the record must hold one sampler logprob per sampled token"
        )


def pack_rows(
    sequences: Iterable[Sequence], *, max_length: int, mask_truncated: bool
) -> tuple[Rows, dict[str, int]]:
    """Right-pad the kept sequences into Rows; return them with drop counts for every reason.

    A dropped sequence is counted once, under the first reason that applies, in the order of
    DROP_REASONS: no trained token; truncated (only when mask_truncated); longer than max_length.
    """
    dropped = dict.fromkeys(DROP_REASONS, 0)
    kept: list[Sequence] = []
    for sequence in sequences:
        if not bool(sequence.trained_mask.any()):
            dropped["no_trainable_tokens"] += 1
        elif mask_truncated and sequence.truncated:
            dropped["truncated"] += 1
        elif len(sequence) > max_length:
            dropped["over_length"] += 1
        else:
            kept.append(sequence)

    width = max((len(s) for s in kept), default=0)
    shape = (len(kept), width)
    rows = Rows(
        input_ids=torch.zeros(shape, dtype=torch.long),
        attention_mask=torch.zeros(shape, dtype=torch.long),
        trained_mask=torch.zeros(shape, dtype=torch.bool),
        old_logprobs=torch.zeros(shape, dtype=torch.float32),
        advantages=torch.tensor([s.advantage for s in kept], dtype=torch.float32),
        group_ids=torch.tensor([s.group_id for s in kept], dtype=torch.long),
        trajectory_ids=[s.trajectory_id for s in kept],
    )
    for row, sequence in enumerate(kept):
        length = len(sequence)
        rows.input_ids[row, :length] = sequence.input_ids
        rows.attention_mask[row, :length] = 1
        rows.trained_mask[row, :length] = sequence.trained_mask
        rows.old_logprobs[row, :length] = sequence.old_logprobs
    return rows, dropped


def micro_batches(rows: Rows, *, token_budget: int) -> list[Rows]:
    """Split rows, longest first, into micro-batches of padded size (rows x longest) <= budget.

    Deterministic: ties in length keep the original row order. A row longer than the budget is
    a micro-batch of its own. Each micro-batch is trimmed to its longest row.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    return [
        rows.select(batch) for batch in longest_first_groups(rows.lengths.tolist(), token_budget)
    ]


def longest_first_groups(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Row indices, longest first, in groups of (rows x longest) <= token_budget tokens.

    Deterministic: ties in length keep the original order. A row longer than the budget is a
    group of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for index in order:
        # Longest first, so the group's first row sets its width.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def sft_sequence(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    assistant_turns: str = "all",
) -> Sequence:
    """A conversation tokenised as serving renders it; its assistant turns trained (SFT).

    The messages are prepared as serving prepares a request (for a template without tool
    support, tools and tool calls become the text the model is taught to write), so SFT trains
    the tokens the model samples. Each trained turn's tokens are what the template adds when
    the turn is appended to the conversation before it (generation prompt excluded).
    `assistant_turns="last"` trains only the final assistant turn: all before it is context.
    """
    if not messages:
        raise ValueError("an SFT example needs at least one message")
    if not has_chat_template(tokenizer):
        raise ValueError(
            "SFT renders each conversation with the model's chat template, and this model has "
            "none (a base model): start art-server with --chat-template NAME or FILE "
            "(docs/models.md, 'Base models')"
        )
    supports_tools = template_supports_tools(tokenizer.chat_template)
    try:
        prepared = prepare_messages(messages, tools, supports_tools=supports_tools)
    except InvalidRequestError as error:
        raise ValueError(error.message) from error
    template_tools = tools if supports_tools else None

    def render(upto: int, generation_prompt: bool) -> list[int]:
        try:
            ids = tokenizer.apply_chat_template(
                prepared[:upto],
                tools=template_tools,
                add_generation_prompt=generation_prompt,
                tokenize=True,
                return_dict=False,
            )
        except Exception as error:  # jinja raises anything on a conversation it cannot render
            raise ValueError(
                f"the model's chat template rejected these messages: {error}"
            ) from error
        return list(ids)

    tokens: list[int] = []
    trained: list[bool] = []
    for original, index in _trained_turns(messages, prepared, assistant_turns):
        prompt = render(index, True) if index else []
        full = render(index + 1, False)
        if prompt[: len(tokens)] != tokens or full[: len(prompt)] != prompt:
            raise ValueError(
                f"message {original}: the chat template does not render this conversation "
                "incrementally, so assistant tokens cannot be located"
            )
        context = prompt[len(tokens) :]
        answer = full[len(prompt) :]
        tokens += [*context, *answer]
        trained += [False] * len(context) + [True] * len(answer)
    if not any(trained):
        raise ValueError("the assistant messages to train on render to no tokens")
    return Sequence(
        input_ids=torch.tensor(tokens, dtype=torch.long),
        trained_mask=torch.tensor(trained, dtype=torch.bool),
        old_logprobs=torch.zeros(len(tokens), dtype=torch.float32),
        advantage=0.0,
        trajectory_id="",
        group_id=0,
        truncated=False,
    )


def _trained_turns(
    messages: list[dict[str, Any]], prepared: list[dict[str, Any]], assistant_turns: str
) -> list[tuple[int, int]]:
    """(index in `messages`, index in `prepared`) of each assistant turn SFT trains."""
    # Assistant messages stay one each, in order, in the prepared list (tool results may merge).
    turns = list(
        zip(
            [i for i, message in enumerate(messages) if message.get("role") == "assistant"],
            [i for i, message in enumerate(prepared) if message["role"] == "assistant"],
            strict=True,
        )
    )
    if not turns:
        raise ValueError("an SFT example needs at least one assistant message to train on")
    return turns[-1:] if assistant_turns == "last" else turns


def sft_sequences(tokenizer: Any, request: SFTRequest) -> list[Sequence]:
    """The `sft_sequence` of each trajectory of an SFT request; a 400 naming the first that
    cannot be one."""
    sequences = []
    for index, example in enumerate(request.trajectories):
        try:
            sequences.append(
                sft_sequence(
                    tokenizer,
                    example.messages,
                    example.tools,
                    assistant_turns=request.config.assistant_turns,
                )
            )
        except ValueError as error:
            raise InvalidRequestError(
                f"trajectories[{index}]: {error}", param=f"trajectories[{index}]"
            ) from error
    if not sequences:
        raise InvalidRequestError("Nothing to train: no trajectories.", param="trajectories")
    return sequences
