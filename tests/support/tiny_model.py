"""Build a tiny random Llama-shaped chat model with a tokenizer trained on the spot.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a few lines of text, so it
can encode any string, and the model is randomly initialised from a fixed seed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "What is the capital of France? The capital of France is Paris.",
    'You are a helpful assistant. {"name": "get_weather", "arguments": {"city": "Paris"}}',
    "<tool_call> </tool_call> <tools> </tools> <tool_response> </tool_response>",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { }",
    "system user assistant tool function arguments name content role true false null",
    "Hello! How can I help you today? Answer with just the number. 12 + 7 = 19",
]


# vLLM's CPU attention takes head sizes of 32 and up: this shape has 64 (2 heads of 128).
VLLM_SHAPE = {"hidden_size": 128, "heads": 2, "kv_heads": 1}


def chatml_tokenizer(tokenizer: Any) -> Any:
    """A `tokenizers.Tokenizer` holding SPECIAL_TOKENS as a transformers tokenizer with ChatML."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_tokenizer(vocab_size: int = 384) -> Any:
    """A byte-level BPE trained on `_CORPUS` (any string encodes), as a ChatML tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return chatml_tokenizer(tokenizer)


def build_tiny_model(
    folder: Path,
    *,
    vocab_size: int = 384,
    seed: int = 0,
    hidden_size: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    chat_template: bool = True,
) -> Path:
    """Write a tiny random LlamaForCausalLM and its ChatML tokenizer into `folder`.

    `chat_template=False`: the tokenizer has no chat template, as a base model's (its vocabulary
    still holds the ChatML tokens, so `--chat-template chatml` fits it)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    fast = tiny_tokenizer(vocab_size)
    if not chat_template:
        fast.chat_template = None
    fast.save_pretrained(folder)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,  # room for a Hermes tools prompt
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": fast.eos_token_id, "bos_token_id": fast.bos_token_id})
    )
    return folder


if __name__ == "__main__":
    import sys
    import time

    start = time.perf_counter()
    print(build_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-model")))
    print(f"built in {time.perf_counter() - start:.2f}s")
