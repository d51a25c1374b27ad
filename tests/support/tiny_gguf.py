"""Write tiny random GGUF files the way llama.cpp's converter does, for the GGUF loading tests.

Nothing is downloaded: a tokenizer is trained on a few lines of text, a tiny transformers model is
initialised from a fixed seed, and both are written with the `gguf` package's `GGUFWriter` under
llama.cpp's metadata keys and tensor names (the ones transformers reads back in
`modeling_gguf_pytorch_utils.load_gguf_checkpoint`). Tensors are F32, so nothing is quantized.

Each family is written as llama.cpp writes it:

    family  tokenizer (tokenizer.ggml.model)    tensor layout undone by transformers on reading
    qwen2   byte-level BPE ("gpt2", pre qwen2)  none; output.weight written (untied head)
    llama   byte-level BPE ("gpt2", pre llama)  attn_q / attn_k rows permuted for rotary halves
    gemma3  sentencepiece BPE ("llama")         every norm stored as weight + 1; head tied

The Gemma file places `<end_of_turn>` at id 106 and declares `<eos>` (id 1) as its eos, like the
Gemma 3 GGUF of issue 37 that did not stop at the end of a turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.tiny_families import TINY_SHAPE

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) "
    "+ '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

_CORPUS = [
    "What is the capital of France? The capital of France is Paris.",
    "You are a helpful assistant. Hello! How can I help you today?",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { }",
    "system user assistant model tool function arguments name content role true false null",
]

# llama.cpp's token types (gguf.TokenType): what add_gguf_special_tokens in transformers reads.
NORMAL, UNKNOWN, CONTROL, UNUSED, BYTE = 1, 2, 3, 5, 6


@dataclass
class Vocabulary:
    """A GGUF tokenizer: the tokens in id order, their types, merges, and the special ids."""

    model: str  # tokenizer.ggml.model
    pre: str | None
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special: dict[str, int] = field(default_factory=dict)  # "bos"/"eos"/"pad"/"unk"/"eot" -> id


def byte_level_vocabulary(pre: str) -> Vocabulary:
    """A byte-level BPE with ChatML's special tokens first: <|endoftext|> 0, <|im_start|> 1,
    <|im_end|> 2, as a Qwen2 or SmolLM2 GGUF lists them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokens, merges = _trained(tokenizer)
    return Vocabulary(
        model="gpt2",
        pre=pre,
        tokens=tokens,
        types=[CONTROL if token in specials else NORMAL for token in tokens],
        merges=merges,
        special={"bos": 1, "eos": 0, "pad": 0},
    )


def sentencepiece_vocabulary() -> Vocabulary:
    """A Gemma-shaped vocabulary: <pad> <eos> <bos> <unk> <mask>, 100 unused slots, then
    <start_of_turn> 105 and <end_of_turn> 106, the 256 byte-fallback tokens, then BPE pieces."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    head = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    head += [f"<unused{index}>" for index in range(100)]
    head += ["<start_of_turn>", "<end_of_turn>"]
    head += [f"<0x{byte:02X}>" for byte in range(256)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False)
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    pieces, merges = _trained(tokenizer)
    tokens = head + [piece for piece in pieces if piece not in head]

    def kind(token: str) -> int:
        if token == "<unk>":
            return UNKNOWN
        if token.startswith("<unused"):
            return UNUSED
        if token.startswith("<0x"):
            return BYTE
        return CONTROL if token in head else NORMAL

    return Vocabulary(
        model="llama",
        pre="default",
        tokens=tokens,
        types=[kind(token) for token in tokens],
        merges=merges,
        special={"pad": 0, "eos": 1, "bos": 2, "unk": 3},
    )


def _trained(tokenizer: Any) -> tuple[list[str], list[str]]:
    """A trained `tokenizers` BPE's tokens in id order and its merges as "a b" strings."""
    import json

    model = json.loads(tokenizer.to_str())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [" ".join(merge) if isinstance(merge, list) else merge for merge in model["merges"]]
    return tokens, merges


@dataclass
class Family:
    """How to build one architecture's tiny model and write it as llama.cpp would."""

    vocabulary: Any  # () -> Vocabulary
    config: Any  # vocab_size -> a transformers config
    template: str


def _config(class_name: str, **fields: Any) -> Any:
    """A config factory (vocab_size -> config) of the tiny shape with `fields` on top."""
    import transformers

    return lambda vocab_size: getattr(transformers, class_name)(
        vocab_size=vocab_size, **TINY_SHAPE, **fields
    )


FAMILIES = {
    "qwen2": Family(
        lambda: byte_level_vocabulary("qwen2"),
        _config("Qwen2Config", tie_word_embeddings=False),
        CHATML_TEMPLATE,
    ),
    "llama": Family(
        lambda: byte_level_vocabulary("llama-bpe"),
        _config("LlamaConfig", tie_word_embeddings=True),
        CHATML_TEMPLATE,
    ),
    "gemma3": Family(
        sentencepiece_vocabulary,
        _config("Gemma3TextConfig", head_dim=16, sliding_window=64, tie_word_embeddings=True),
        GEMMA_TEMPLATE,
    ),
}


def write_tiny_gguf(
    path: Path,
    architecture: str,
    *,
    seed: int = 0,
    chat_template: str | None = "family",
    answer: str | None = None,
) -> Path:
    """Write a tiny random `architecture` model (a key of FAMILIES) as an F32 GGUF at `path`.

    `chat_template="family"` writes the family's own template; None writes none. `answer` (a
    token; untied families only) makes that token the model's choice after any input.
    """
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    family = FAMILIES[architecture]
    vocabulary = family.vocabulary()
    config = family.config(len(vocabulary.tokens))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if answer is not None:
        _always_answer(model, vocabulary.tokens.index(answer))
    template = family.template if chat_template == "family" else chat_template

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{architecture}")
    _write_hyperparameters(writer, architecture, config)
    _write_tokenizer(writer, vocabulary, template)
    if architecture == "gemma3":
        writer.add_eot_token_id(vocabulary.tokens.index("<end_of_turn>"))
    for name, array in _gguf_tensors(model, architecture):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_metadata_only_gguf(path: Path, architecture: str, *, split_count: int = 1) -> Path:
    """A GGUF that declares `architecture` and holds one tensor: enough to be refused by name.

    `split_count` above 1 marks it as the first part of a split file (llama-gguf-split).
    """
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{architecture}")
    writer.add_block_count(1)
    if split_count > 1:
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, 0)
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, split_count)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_hyperparameters(writer: Any, architecture: str, config: Any) -> None:
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters.get("rope_theta", 10000.0)))
    if architecture == "llama":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    if architecture == "gemma3":
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)


def _write_tokenizer(writer: Any, vocabulary: Vocabulary, template: str | None) -> None:
    writer.add_tokenizer_model(vocabulary.model)
    if vocabulary.pre:
        writer.add_tokenizer_pre(vocabulary.pre)
    writer.add_token_list(vocabulary.tokens)
    writer.add_token_types(vocabulary.types)
    if vocabulary.model == "llama":  # sentencepiece files carry scores: earlier is better
        writer.add_token_scores([-float(index) for index in range(len(vocabulary.tokens))])
    writer.add_token_merges(vocabulary.merges)
    writer.add_bos_token_id(vocabulary.special["bos"])
    writer.add_eos_token_id(vocabulary.special["eos"])
    writer.add_pad_token_id(vocabulary.special["pad"])
    if "unk" in vocabulary.special:
        writer.add_unk_token_id(vocabulary.special["unk"])
    if template is not None:
        writer.add_chat_template(template)


def _gguf_tensors(model: Any, architecture: str) -> list[tuple[str, Any]]:
    """The model's weights under llama.cpp's names, with llama.cpp's layout changes applied."""
    import gguf

    config = model.config
    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    tensors = []
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp writes no output.weight for a tied head
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        array = tensor.detach().float().numpy().copy()
        if architecture == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads
            if "attn_k" in gguf_name:
                heads = config.num_key_value_heads
            array = _rotary_permute(array, heads)
        if architecture == "gemma3" and gguf_name.endswith("norm.weight"):
            array = array + 1.0  # llama.cpp stores Gemma's zero-centred norms as weight + 1
        tensors.append((gguf_name, array))
    return tensors


def _always_answer(model: Any, token_id: int) -> None:
    """Make `token_id` the most likely next token after any input, by a wide margin.

    The layers add nothing to the residual stream (o_proj and down_proj are zero), so the last
    position holds its token's embedding, whose dimension 0 is set to 1 in every row; the final
    norm keeps only that dimension, and only `token_id`'s output row reads it.
    """
    import torch

    assert not model.config.tie_word_embeddings, "needs an output head of its own"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[token_id, 0] = 10.0


def _rotary_permute(weights: Any, heads: int) -> Any:
    """llama.cpp's `permute` for attn_q / attn_k (convert_hf_to_gguf.py, LlamaModel.permute)."""
    shape = weights.shape
    return (
        weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )


if __name__ == "__main__":
    import sys
    import time

    start = time.perf_counter()
    for name in FAMILIES:
        print(
            write_tiny_gguf(
                Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp") / f"{name}.gguf", name
            )
        )
    print(f"written in {time.perf_counter() - start:.2f}s")
