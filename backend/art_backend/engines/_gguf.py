"""A GGUF file as a plain transformers model folder, and the tokens that end a turn.

A GGUF (llama.cpp's single-file format) holds weights, possibly quantized, plus its config,
tokenizer and chat template as metadata. transformers reads the families listed in
`supported_architectures()`, but a model it loads from a GGUF cannot be saved or trained ("The
model is quantized with gguf and is not serializable"). So the file is converted once:

    reading       the header, checked whole first (_gguf_reading.py): architecture, tensors,
                  the ids it declares as stop tokens; then transformers reads the config and
                  the tokenizer, the file parsed once for all its readers (`parsed_once`)
    dequantizing  transformers' own GGUF reader, every weight unpacked into float32
    writing       a fresh model of the same architecture (AutoModelForCausalLM.from_config on
                  the config without its quantization_config) takes those tensors and is saved
                  with its tokenizer, chat template and a generation_config.json whose
                  `eos_token_id` lists every stop token

float32 keeps the dequantized values exact (bf16 would round them a second time); load_model
casts to the requested dtype afterwards. _loading.py decides where the folder goes and builds it
under its cache lock; this module only converts.

Stop tokens: generation ends at any of `stop_token_ids(tokenizer, declared)`: the tokenizer's eos,
the ids a generation config or the GGUF declares (`tokenizer.ggml.eos_token_id`,
`eot_token_id`, `eom_token_id`), and every `_stop_tokens.END_OF_TURN_TOKENS` entry the tokenizer holds as an
added token. A chat model whose files name only a document-end eos (a Gemma 3 GGUF declaring
`<eos>` and not `<end_of_turn>`) would otherwise talk past the end of its turn.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from art_backend._errors import ModelLoadError
from art_backend.engines._gguf_reading import GGUF_MAGIC, parsed_once, read_gguf_metadata
from art_backend.engines._stop_tokens import stop_token_ids

logger = logging.getLogger("art_backend.loading")

GGUF_SUFFIX = ".gguf"
# Part of every converted folder's fingerprint: a change to what conversion writes rebuilds caches.
CONVERSION_FORMAT = 2


@dataclass(frozen=True)
class GgufDefaults:
    """What a known file lacks: a chat template when it carries none, and the eos to use."""

    chat_template: str | None = None
    eos_token: str | None = None


# --- finding the file and naming its cache --------------------------------------------------------


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` names (the file itself, or a folder's only .gguf), or None if none.

    A folder holding several GGUF files is refused: which one to load is the user's choice.
    """
    if path.is_file():
        # By content too: Ollama keeps its GGUF files as blobs named sha256-<digest>.
        if path.suffix.lower() != GGUF_SUFFIX and not _starts_like_gguf(path):
            raise ModelLoadError(
                f"'{path}' is a file but not a GGUF file. Pass a GGUF file, or a model folder "
                "saved with save_pretrained() (config.json + safetensors)."
            )
        return path.resolve()
    found = sorted(child for child in path.glob("*") if child.suffix.lower() == GGUF_SUFFIX)
    if len(found) > 1:
        names = ", ".join(child.name for child in found)
        raise ModelLoadError(
            f"'{path}' holds {len(found)} GGUF files ({names}); pass one of them, for example "
            f"--model {found[0]}."
        )
    return found[0].resolve() if found else None


def _starts_like_gguf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == GGUF_MAGIC


def gguf_cache_key(gguf_path: Path) -> tuple[str, str]:
    """The cache folder name for `gguf_path` (its stem and a short fingerprint) and the fingerprint.

    The fingerprint covers the resolved path, size and modification time, so a file replaced in
    place is converted again and two files of the same name do not share a folder.
    """
    stat = gguf_path.stat()
    fingerprint = f"gguf-{CONVERSION_FORMAT}:{gguf_path}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", gguf_path.stem).strip("-.") or "model"
    return f"{stem}-{digest}", fingerprint


def supported_architectures() -> list[str]:
    """The GGUF `general.architecture` values this transformers reads, by its own tables."""
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # The legacy table also holds two metadata sections that are no architecture.
    legacy = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    return sorted(legacy | set(GGUF_CONFIG_ARCHS))


# --- converting ---------------------------------------------------------------------------------


def convert_gguf(gguf_path: Path, out_dir: Path, defaults: GgufDefaults | None = None) -> None:
    """Dequantize `gguf_path` into `out_dir` as a float32 model folder with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    defaults = defaults or GgufDefaults()
    started = time.perf_counter()
    metadata = read_gguf_metadata(gguf_path)
    logger.info(
        "Converting %s (%s, %s, %d tensors) into %s, once; a 1B model takes minutes",
        gguf_path.name,
        _size(gguf_path.stat().st_size),
        metadata.architecture,
        metadata.tensor_count,
        out_dir.parent,
    )
    folder, name = str(gguf_path.parent), gguf_path.name
    with parsed_once():
        config = _read_config(gguf_path, metadata.architecture)
        with _unreadable(gguf_path, "tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        logger.info("reading: config and tokenizer in %.1f s", time.perf_counter() - started)

        stage = time.perf_counter()
        dense = GgufConfig(dequantize=True)  # no packed GGUF modules: plain tensors to save
        with _unreadable(gguf_path, "weights"):
            gguf_model = AutoModelForCausalLM.from_pretrained(
                folder,
                gguf_file=name,
                config=config,
                dtype=torch.float32,
                quantization_config=dense,
            )
    state = gguf_model.state_dict()
    parameters = sum(tensor.numel() for tensor in gguf_model.parameters())
    logger.info(
        "dequantizing: %s parameters into float32 (%s) in %.1f s",
        f"{parameters / 1e6:,.1f}M",
        _size(parameters * 4),
        time.perf_counter() - stage,
    )

    stage = time.perf_counter()
    model = _plain_model(gguf_model, state, gguf_path)
    del gguf_model, state
    if defaults.chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = defaults.chat_template
    if defaults.eos_token and tokenizer.eos_token != defaults.eos_token:
        tokenizer.eos_token = defaults.eos_token
    declared = [*metadata.declared_stop_ids, *as_list(config.eos_token_id)]
    stop_ids = stop_token_ids(tokenizer, declared)
    if stop_ids:  # every loader reads the stop list from here; vLLM adds it to a request's stops
        eos: int | list[int] = stop_ids if len(stop_ids) > 1 else stop_ids[0]
        model.config.eos_token_id = eos
        model.generation_config.eos_token_id = eos
    model.generation_config._from_model_config = False  # its own file, not derived from config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    written = sum(path.stat().st_size for path in out_dir.rglob("*") if path.is_file())
    logger.info("writing: %s in %.1f s", _size(written), time.perf_counter() - stage)
    logger.info(
        "Converted %s in %.1f s; stop tokens %s",
        gguf_path.name,
        time.perf_counter() - started,
        [tokenizer.convert_ids_to_tokens(token_id) for token_id in stop_ids],
    )


def _read_config(gguf_path: Path, architecture: str) -> Any:
    """The model config transformers reads from the GGUF, or a ModelLoadError saying why not."""
    from transformers import AutoConfig

    try:
        with _unreadable(gguf_path, "config"):
            return AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except ModelLoadError as exc:
        # transformers says "GGUF model with architecture X is not supported yet."
        if "not supported" not in str(exc.__cause__):
            raise
        raise ModelLoadError(
            f"'{gguf_path.name}' holds a '{architecture}' model, which transformers cannot read "
            f"from GGUF. Supported GGUF architectures: {', '.join(supported_architectures())}. "
            "Use the model's original safetensors folder or hub id instead."
        ) from exc.__cause__


@contextlib.contextmanager
def _unreadable(gguf_path: Path, part: str) -> Iterator[None]:
    """Turn transformers' refusal to read a part of the file into a ModelLoadError.

    A file read_gguf_metadata accepted is whole and well formed, but its values can still be
    garbled: a vocabulary whose merges name a token it lacks, a config value out of range. What
    transformers then raises depends on where: ValueError, KeyError, IndexError, TypeError,
    OSError (a config it "cannot parse as JSON"), huggingface_hub's validation error, or the bare
    Exception of the tokenizers library ("Token ... out of vocabulary"). Any of them means it
    cannot read this file; only running out of memory is not that.
    """
    try:
        yield
    except (ModelLoadError, MemoryError):
        raise
    except Exception as exc:  # any other failure is the file's (see above)
        raise ModelLoadError(
            f"transformers could not read the {part} of '{gguf_path.name}': {exc}. Use the "
            "model's original safetensors folder or hub id instead."
        ) from exc


def _plain_model(gguf_model: Any, state: dict[str, torch.Tensor], gguf_path: Path) -> Any:
    """A model of the same architecture without GGUF quantization, holding `state`'s tensors.

    Built on the meta device and given the tensors themselves (assign=True), so the weights are
    not held twice.
    """
    from transformers import AutoModelForCausalLM

    # A fresh config without the GGUF quantization_config, so the folder loads like any other.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(gguf_model.config).from_dict(config_dict)
    config.dtype = torch.float32
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except ValueError as exc:
        raise ModelLoadError(
            f"'{gguf_path.name}' holds a {config.model_type} model, which is not a causal "
            f"language model; only those can be served and trained. ({exc})"
        ) from exc
    model.load_state_dict(state, strict=True, assign=True)
    model.generation_config = gguf_model.generation_config
    if config.tie_word_embeddings:
        model.tie_weights()
        embed: Any = model.get_input_embeddings().weight
        head: Any = model.get_output_embeddings().weight
        if embed.data_ptr() != head.data_ptr():
            raise ModelLoadError(f"Converting {gguf_path.name} left lm_head untied; cannot use it.")
    return model


def _size(count: float) -> str:
    """A byte count for a log line: 512 B, 3.4 MB, 1.2 GB."""
    if count < 1024:
        return f"{count:.0f} B"
    for unit in ("KB", "MB"):
        count /= 1024
        if count < 1024:
            return f"{count:.1f} {unit}"
    return f"{count / 1024:.1f} GB"


def as_list(value: Any) -> list[Any]:
    """A config's eos_token_id (None, an int or a list of ints) as a list."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
