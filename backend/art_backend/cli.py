"""`art-server`: serve a base model and its LoRA checkpoints over an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from art_backend._auth import add_access_arguments
from art_backend._errors import (
    BackendError,
    InvalidNameError,
    InvalidRequestError,
    ModelLoadError,
)
from art_backend._limits import DEFAULT_MAX_BODY_MB
from art_backend._log_redaction import LOG_LEVELS
from art_backend._phases import announce
from art_backend._settings import ServerSettings
from art_backend.engines._chat_templates import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    has_chat_template,
    install_chat_template,
    no_template_message,
    read_chat_template,
)
from art_backend.engines._engine_choice import (
    ENGINE_CHOICES,
    pick_engine,
    wait_passively_beside_vllm,
)
from art_backend.engines._remote_engine import RemoteEngine
from art_backend.engines._replica_setup import health_probe, replica_count, torch_replicas
from art_backend.engines._replicas import ROUTINGS, Probe, replica_set
from art_backend.engines._thread_settings import parse_threads, thread_governor
from art_backend.engines._vllm_options import vllm_replicas
from art_core._arguments import positive_int
from art_core.names import base_model_aliases, is_served_name

if TYPE_CHECKING:
    from fastapi import FastAPI

    from art_backend.engines._engine import Engine
    from art_backend.engines._loading import LoadedModel
    from art_backend.engines._torch_engine import TorchEngine
    from art_backend.training._distributed import TrainingTeam

__all__ = ["build_app", "main"]

logger = logging.getLogger("art_backend.cli")


def build_app(settings: ServerSettings) -> FastAPI:
    """Load the model, start the engine, and return the FastAPI app (engine stops on shutdown).

    Several replicas (`settings.replicas`, or several `vllm.replica_urls`): the engines stand
    behind one `ReplicaSet` that routes by `settings.routing` (docs/serving.md, "Engine
    replicas"). `settings.chat_template`: a built-in template's name or a Jinja file, in place
    of the tokenizer's (`engines._chat_templates`)."""
    from art_backend._app import create_app
    from art_backend.engines._constrained import GrammarCompiler
    from art_backend.engines._loading import load_model
    from art_backend.engines._torch_engine import TorchEngine
    from art_backend.engines._vllm_process import find_vllm_python
    from art_backend.serving.chat._service import ChatService
    from art_backend.store._records import CompletionRecords
    from art_backend.training._training_service import TrainingService

    served_name = settings.name or default_served_name(settings.base_model)
    _check_choices(served_name, settings.engine, settings.trainer)
    replica_count(settings.replicas, settings.engine, settings.vllm)  # before anything loads
    fixed_threads = parse_threads(settings.threads)
    template = read_chat_template(settings.chat_template) if settings.chat_template else None
    vllm_python = settings.vllm.url or find_vllm_python(settings.vllm.python)
    loaded = load_model(settings.base_model, dtype=settings.dtype, device=settings.device)
    _settle_chat_template(loaded, template)
    picked, why = pick_engine(settings.engine, loaded.device.type, vllm_python)
    logger.info("engine: %s (%s)", picked, why)
    announce(f"starting the {picked} engine ({loaded.dtype} on {loaded.device.type})")
    count = replica_count(settings.replicas, picked, settings.vllm)  # auto may have picked vLLM
    if settings.trainer == "unsloth":
        _load_through_unsloth(loaded, picked)
    # The torch engine serves and trains on one copy of the weights; with vLLM serving, this
    # copy is the trainer's alone. Either way the trainer trains in the dtype load_model chose.
    torch_engine = TorchEngine(
        loaded.model,
        loaded.tokenizer,
        eos_token_ids=loaded.eos_token_ids,
        context_length=loaded.context_length,
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        threads=thread_governor(
            fixed_threads, loaded.device.type, count if picked == "torch" else 1
        ),
    )
    base_names = list(dict.fromkeys([served_name, *base_model_aliases(settings.base_model)]))
    serving = _serving_engine(settings, picked, count, vllm_python, loaded, torch_engine)
    # What PEFT records in adapter_config.json: the folder or hub id the weights came from.
    try:
        serving.start()
        load_checkpoints(serving, settings.art_path, [*base_names, str(loaded.source)])
    except BaseException:
        serving.stop()
        raise
    records = CompletionRecords()
    service = ChatService(
        serving,
        base_names=base_names,
        records=records,
        grammar_compiler=GrammarCompiler(loaded.tokenizer, loaded.eos_token_ids),
    )
    training = TrainingService(
        serving,
        records,
        art_path=settings.art_path,
        base_names=base_names,
        trainer_host=torch_engine,
        team=_training_team(settings, loaded, serving),
    )
    return create_app(
        service,
        api_key=settings.api_key,
        art_path=settings.art_path,
        training=training,
        allowed_hosts=settings.allowed_hosts,
        max_body_mb=settings.max_body_mb,
        engine_routes=settings.replica_api,
    )


TRAINER_CHOICES = ("torch", "unsloth")


def _serving_engine(
    settings: ServerSettings,
    picked: str,
    count: int,
    vllm_python: str | None,
    loaded: LoadedModel,
    torch_engine: TorchEngine,
) -> Engine:
    """The engine that serves, not started: the torch engine or vLLM, or `count` replicas of
    the picked one behind one `ReplicaSet`."""
    if picked == "vllm":
        assert vllm_python is not None
        engines = vllm_replicas(settings.vllm, vllm_python, loaded, torch_engine, settings.art_path)
        probes: list[Probe | None] = [health_probe(e.process.base_url) for e in engines]
    else:
        engines = torch_replicas(torch_engine, count)
        probes = [None] * count
    for url in settings.remote_replicas:  # art-servers on other hosts (`_remote_engine`)
        engines.append(RemoteEngine(url, loaded.tokenizer, api_key=settings.api_key))
        probes.append(health_probe(url.rstrip("/")))
    if len(engines) > 1:
        return replica_set(engines, probes=probes, routing=settings.routing)
    return engines[0]


def _settle_chat_template(loaded: LoadedModel, template: ChatTemplate | None) -> None:
    """Install `--chat-template` on the tokenizer (its end-of-turn token stops generation too,
    on every engine built after this); without any template, say so at start."""
    if template is not None:
        for token_id in install_chat_template(loaded.tokenizer, template):
            if token_id not in loaded.eos_token_ids:
                loaded.eos_token_ids.append(token_id)
        logger.info("chat template: %s", template.source)
    elif not has_chat_template(loaded.tokenizer):
        logger.warning(
            "%s Chat Completions, Responses and Messages requests will be refused with a 400.",
            no_template_message(),
        )


def _check_choices(served_name: str, engine: str, trainer: str) -> None:
    """What can be refused before anything loads: the name, the engine, the trainer."""
    if not is_served_name(served_name):
        raise InvalidNameError(
            f"Invalid served name {served_name!r}: use letters, digits, '.', '_', '-' or '/', "
            "no '..' and no '@' (reserved for adapter steps)."
        )
    if engine not in ENGINE_CHOICES:
        raise InvalidRequestError(f"--engine must be one of {', '.join(ENGINE_CHOICES)}")
    if trainer not in TRAINER_CHOICES:
        raise InvalidRequestError(f"--trainer must be one of {', '.join(TRAINER_CHOICES)}")
    if trainer == "unsloth":
        from art_backend.training._unsloth import check_unsloth_available

        check_unsloth_available()  # before loading anything: CUDA and the package


def _training_team(
    settings: ServerSettings, loaded: LoadedModel, serving: Engine
) -> TrainingTeam | None:
    """The trainer's other processes (`--train-processes`, or torchrun's ranks); the engine
    stops if they cannot start."""
    from art_backend.training._distributed import start_team, torchrun_rank

    if settings.trainer == "unsloth" and (
        settings.train_processes > 1 or torchrun_rank() is not None
    ):
        serving.stop()
        raise InvalidRequestError(
            "--trainer unsloth trains on one process: leave out --train-processes (and torchrun)."
        )
    # The other ranks load in the dtype this process settled on (`auto` may have been measured:
    # a rank measuring for itself could pick the other one).
    settled = str(loaded.dtype).removeprefix("torch.")
    try:
        return start_team(
            settings.train_processes, model=settings.base_model, dtype=settled, device=loaded.device
        )
    except BaseException:
        serving.stop()
        raise


def _load_through_unsloth(loaded: LoadedModel, picked: str) -> None:
    """The trainer's model replaced by Unsloth's (CUDA; vLLM serves, so torch never decodes)."""
    if picked != "vllm":
        raise InvalidRequestError(
            "--trainer unsloth needs --engine vllm: Unsloth replaces the model classes' "
            "forward for the whole process, and the torch engine cannot decode on it."
        )
    from art_backend.training._unsloth import load_unsloth_model

    loaded.model, _ = load_unsloth_model(
        loaded.source, dtype=loaded.dtype, max_seq_length=loaded.context_length
    )


def default_served_name(base_model: str) -> str:
    """A hub id serves under itself; a local folder under the folder's name."""
    if is_served_name(base_model):
        return base_model
    return Path(base_model).expanduser().name or "base"


def discover_checkpoints(
    art_path: Path, base_names: list[str] | None = None, per_model: int = 2
) -> tuple[list[tuple[str, Path]], list[str]]:
    """The newest checkpoints of each model under `.art/<project>/models/<name>/checkpoints/<step>/`.

    Returned as (`name@step`, path) pairs, plus why each skipped model was skipped: with
    `base_names`, a model whose recorded base model (its `model.json`, else its adapters'
    `base_model_name_or_path`) is not one of them was trained on another base model and would
    not load. Older steps stay on disk and load on request (POST /v1/adapters).
    """
    from art_backend.store._checkpoints import ModelStore

    found, skipped = [], []
    projects: dict[str, str] = {}  # served name -> the project it was loaded from
    for checkpoints in sorted(art_path.glob("*/models/*/checkpoints")):
        model_dir = checkpoints.parent
        project, name = model_dir.parent.parent.name, model_dir.name
        if name in projects:
            # Served names carry no project (ART's names): the first project keeps the name.
            skipped.append(
                f"{project}/{name}: the name is already served for project {projects[name]!r} "
                "(served names carry no project); serve this project from its own --path"
            )
            continue
        try:
            store = ModelStore(art_path, project, name)
            # Any PEFT folder named by its step (step.json marks the trainer's own).
            steps = [
                store.checkpoint_dir(step)
                for step in sorted(
                    int(p.name)
                    for p in checkpoints.iterdir()
                    if p.name.isascii() and p.name.isdigit()
                )
                if (store.checkpoint_dir(step) / "adapter_config.json").is_file()
            ]
        except BackendError as error:  # a bad folder name, a link leading outside --path
            skipped.append(f"{project}/{name}: {error.message}")
            continue
        recorded = _recorded_base_model(store, steps)
        if base_names is not None and recorded is not None and recorded not in base_names:
            skipped.append(
                f"{project}/{name}: trained on base model {recorded!r}, not {base_names[0]!r} "
                f"({len(steps)} checkpoint(s))"
            )
            continue
        projects[name] = project
        for step_dir in steps[-per_model:]:
            found.append((f"{name}@{int(step_dir.name)}", step_dir))
    return found, skipped


def _recorded_base_model(store, steps: list[Path]) -> str | None:
    """The base model a model was trained on, as recorded at registration or by PEFT."""
    import json

    config = store.read_model_config()
    if isinstance(config, dict) and isinstance(config.get("base_model"), str):
        return config["base_model"]
    for step_dir in reversed(steps):
        try:
            adapter = json.loads((step_dir / "adapter_config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(adapter, dict) and isinstance(adapter.get("base_model_name_or_path"), str):
            return adapter["base_model_name_or_path"]
    return None


def load_checkpoints(engine, art_path: Path, base_names: list[str]) -> int:
    """Serve the newest checkpoints under `art_path` whose base model is this one; returns how
    many models were skipped (each logged). A model's latest checkpoint that still fails to load
    stops the start with an error naming it and the cause; an older one (half-deleted by a
    crash, say) is skipped with a warning naming it. First, the temporary checkpoint folders
    of killed servers go (`store._crash_leftovers`)."""
    from art_backend.store._crash_leftovers import remove_crash_leftovers

    for leftover in remove_crash_leftovers(art_path):
        logger.warning("removed %s, an incomplete checkpoint a killed server left", leftover)
    found, skipped = discover_checkpoints(art_path, base_names)
    # Steps come oldest first within a model: the last path seen for a name is its latest.
    latest = {adapter_name.rpartition("@")[0]: path for adapter_name, path in found}
    for reason in skipped:
        logger.warning("not serving the checkpoints of %s", reason)
    if skipped:
        logger.warning(
            "%d model(s) under %s were skipped (other base model, or a bad folder); their "
            "checkpoints stay on disk",
            len(skipped),
            art_path,
        )
    for adapter_name, adapter_path in found:
        try:
            engine.load_adapter(adapter_name, adapter_path)
        except Exception as error:
            reason = " ".join(str(error).split())[:300]
            if adapter_path != latest[adapter_name.rpartition("@")[0]]:
                logger.warning(
                    "not serving %s, an older step of its model: it does not load (%s: %s); "
                    "the folder stays on disk (half-deleted by a crash? then delete it)",
                    adapter_path,
                    type(error).__name__,
                    reason,
                )
                continue
            raise ModelLoadError(
                f"Checkpoint {adapter_path} does not load onto base model {base_names[0]!r} "
                f"({type(error).__name__}: {reason}). If it was trained on another base model, "
                f"move its model folder out of {art_path} or start the backend with that model."
            ) from error
    return len(skipped)


def _exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """SIGTERM ourselves (a graceful stop) once `parent_pid` is gone: a parent killed without
    running its cleanup (SIGKILL, SIGTERM) must not leave a backend holding memory and cores."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _add_vllm_arguments(vllm_group: argparse._ArgumentGroup) -> None:
    vllm_group.add_argument("--vllm-python", help="interpreter with vLLM (or ART_VLLM_PYTHON)")
    vllm_group.add_argument(
        "--vllm-url",
        action="append",
        help="use this running vLLM server (same file system) instead of starting one; "
        "repeated: one engine replica per server",
    )
    vllm_group.add_argument("--max-lora-rank", type=int, default=16)
    vllm_group.add_argument(
        "--vllm-kv-cache-gb", type=int, default=2, help="CPU only: vLLM's KV cache size"
    )
    vllm_group.add_argument(
        "--vllm-sleep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CUDA: vLLM sleeps during training steps (default when it shares the GPU)",
    )
    vllm_group.add_argument(
        "--vllm-devices", help="CUDA_VISIBLE_DEVICES for vLLM: a GPU of its own, e.g. 1"
    )
    vllm_group.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to vLLM as it is, e.g. --vllm-arg=--tensor-parallel-size=2 (repeatable)",
    )


def _parser() -> argparse.ArgumentParser:
    """`art-server`'s arguments."""
    parser = argparse.ArgumentParser(prog="art-server", description=__doc__)
    parser.add_argument(
        "--model",
        required=True,
        help="local folder, GGUF file (or a folder holding one), hub id, or smollm2-135m-instruct",
    )
    parser.add_argument("--name", help="served name of the base model (default: --model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    add_access_arguments(parser, reached="server")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--path", default=".art", type=Path, help="checkpoints folder")
    _add_engine_arguments(parser)
    _add_vllm_arguments(parser.add_argument_group("vLLM engine"))
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    parser.add_argument(
        "--exit-with-parent",
        type=int,
        metavar="PID",
        help="shut down gracefully when process PID exits (LocalBackend passes its own pid)",
    )
    return parser


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """How the engine batches, replicates and templates, and who trains."""
    parser.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=128,
        help="rows (choices) decoded together (torch engine)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=65536,
        help="rows x (prompt + max new tokens) decoded together: bounds the KV cache",
    )
    parser.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="torch-engine replicas, each with its own copy of the weights (vLLM: one "
        "--vllm-url per replica)",
    )
    parser.add_argument(
        "--routing",
        default="sticky",
        choices=ROUTINGS,
        help="across replicas: sticky = a rollout's turns on one replica, else the least busy; "
        "least; random",
    )
    parser.add_argument(
        "--replica-url",
        action="append",
        default=[],
        metavar="URL",
        help="another art-server (started with --replica-api, same --model and --api-key) that "
        "decodes for this one as an engine replica; repeatable (docs/cluster.md)",
    )
    parser.add_argument(
        "--replica-api",
        action="store_true",
        help="serve the engine routes (/v1/engine/...) so that another art-server may use this "
        "one as an engine replica (its --replica-url)",
    )
    parser.add_argument(
        "--threads",
        default="auto",
        help="torch threads on a CPU: auto = the cores other processes leave idle, re-measured "
        "every 0.5 s (at most OMP_NUM_THREADS); a number fixes it",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE_OR_NAME",
        help="the chat template, in place of the tokenizer's (a base model has none): a Jinja "
        f"file, or a built-in: {', '.join(BUILTIN_TEMPLATES)} (docs/models.md, 'Base models')",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY_MB,
        help="largest request body in MiB (bigger: 413)",
    )
    parser.add_argument(
        "--engine",
        default="auto",
        choices=ENGINE_CHOICES,
        help="auto: vLLM on CUDA when installed, else torch (the rule: docs/serving.md, 'Engines')",
    )
    parser.add_argument(
        "--trainer",
        default="torch",
        choices=TRAINER_CHOICES,
        help="unsloth: the trainer's model through Unsloth (CUDA, [unsloth] extra, --engine vllm)",
    )
    parser.add_argument(
        "--train-processes",
        type=positive_int,
        default=1,
        metavar="N",
        help="train data-parallel on N processes of this machine, each with its own copy of "
        "the base model (CPU: gloo; CUDA: NCCL, a GPU each); torchrun starts them instead",
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run uvicorn until SIGTERM/SIGINT (in-flight requests are drained)."""
    parser = _parser()
    args = parser.parse_args(argv)
    announce("starting (importing torch and transformers)")
    if "torch" not in sys.modules:
        wait_passively_beside_vllm(args.engine, args.device)
    if args.exit_with_parent:
        _exit_with_parent(args.exit_with_parent)

    from art_backend._log_redaction import configure_logging, run_uvicorn

    configure_logging(args.log_level)
    from art_backend.training._distributed import torchrun_rank
    from art_backend.training._other_ranks import serve_torchrun_rank

    try:
        launched = torchrun_rank()
        if launched is not None and launched[0] != 0:  # rank 0 serves, the rest train
            serve_torchrun_rank(args.model, dtype=args.dtype, device=args.device)
            return
        app = build_app(ServerSettings.from_arguments(args))
    except BackendError as error:
        parser.exit(2, f"art-server: error: {error.message}\n")
    try:
        run_uvicorn(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=60,
        )
    finally:
        app.state.training.stop_team()  # the other training processes, after the last step


if __name__ == "__main__":
    main()
