"""Stop tokens: the ids that end generation, the same list for both engines.

`stop_token_ids` builds it when a model loads (`LoadedModel.eos_token_ids`; vLLM receives it as
`stop_token_ids`): the tokenizer's eos, the ids the model's files declare (generation config,
a GGUF's eos/eot/eom), and every end-of-turn token of `END_OF_TURN_TOKENS` the tokenizer holds.
A chat model whose files name only an end-of-document eos would otherwise talk past its turn
(a Gemma 3 GGUF declaring `<eos>` never stopped at `<end_of_turn>`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EndOfTurn:
    """A special token that ends an assistant turn in some family's chat format."""

    token: str
    family: str
    # Not a stop token in a vocabulary that also holds this token: there it means something else.
    unless: str | None = None


# Stop tokens by family. Each counts only when the tokenizer holds it as an added (special) token,
# so a plain word that happens to be spelled the same never stops generation.
END_OF_TURN_TOKENS: tuple[EndOfTurn, ...] = (
    EndOfTurn("<|im_end|>", "ChatML: Qwen, SmolLM, Hermes, Phi-4"),
    EndOfTurn("<end_of_turn>", "Gemma 1 to 3"),
    EndOfTurn("<turn|>", "Gemma 4"),
    EndOfTurn("<|eot_id|>", "Llama 3"),
    EndOfTurn("<|eom_id|>", "Llama 3.1 and later, after a built-in tool call"),
    # harmony (gpt-oss) ends each message of a turn with <|end|> and the turn with <|return|>.
    EndOfTurn("<|end|>", "Phi-3, Phi-4-mini", unless="<|return|>"),
    EndOfTurn("<|return|>", "gpt-oss (harmony), the final answer"),
    EndOfTurn("<|call|>", "gpt-oss (harmony), a tool call"),
    EndOfTurn("<|END_OF_TURN_TOKEN|>", "Cohere Command R"),
)


# --- stop tokens --------------------------------------------------------------------------------


def stop_token_ids(tokenizer: Any, declared: Iterable[Any] = ()) -> list[int]:
    """The tokenizer's eos, then the `declared` ids, then END_OF_TURN_TOKENS the tokenizer holds
    as added tokens; in that order, without duplicates or ids outside the vocabulary."""
    added = {entry.content: token_id for token_id, entry in tokenizer.added_tokens_decoder.items()}
    turn_ends = [
        added[row.token]
        for row in END_OF_TURN_TOKENS
        if row.token in added and (row.unless is None or row.unless not in added)
    ]
    vocabulary_size = len(tokenizer)
    ids: list[int] = []
    for token_id in [tokenizer.eos_token_id, *declared, *turn_ends]:
        if isinstance(token_id, int) and 0 <= token_id < vocabulary_size and token_id not in ids:
            ids.append(token_id)
    return ids
