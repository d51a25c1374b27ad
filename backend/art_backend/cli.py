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

from art_backend._auth import add_access_arguments
from art_backend._errors import BackendError, InvalidNameError, ModelLoadError
from art_backend._limits import DEFAULT_MAX_BODY_MB
from art_core.names import base_model_aliases, is_served_name

__all__ = ["build_app", "main"]

logger = logging.getLogger("art_backend.cli")


def build_app(
    base_model: str,
    *,
    name: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    api_key: str | None = None,
    art_path: Path = Path(".art"),
    max_batch_size: int = 32,
    allowed_hosts: list[str] | None = None,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
):
    """Load the model, start the engine, and return the FastAPI app (engine stops on shutdown)."""
    from art_backend._app import create_app
    from art_backend.serving._chat import ChatService
    from art_backend.serving._constrained import GrammarCompiler
    from art_backend.serving._loading import load_model
    from art_backend.serving._records import CompletionRecords
    from art_backend.serving._torch_engine import TorchEngine
    from art_backend.training._service import TrainingService

    served_name = name or default_served_name(base_model)
    if not is_served_name(served_name):
        raise InvalidNameError(
            f"Invalid served name {served_name!r}: use letters, digits, '.', '_', '-' or '/', "
            "no '..' and no '@' (reserved for adapter steps)."
        )
    loaded = load_model(base_model, dtype=dtype, device=device)
    engine = TorchEngine(
        loaded.model,
        loaded.tokenizer,
        eos_token_ids=loaded.eos_token_ids,
        context_length=loaded.context_length,
        max_batch_size=max_batch_size,
    )
    base_names = list(dict.fromkeys([served_name, *base_model_aliases(base_model)]))
    # What PEFT records in adapter_config.json: the folder or hub id the weights came from.
    load_checkpoints(engine, art_path, [*base_names, str(loaded.source)])
    engine.start()
    records = CompletionRecords()
    service = ChatService(
        engine,
        base_names=base_names,
        records=records,
        grammar_compiler=GrammarCompiler(loaded.tokenizer, loaded.eos_token_ids),
    )
    training = TrainingService(engine, records, art_path=art_path, base_names=base_names)
    return create_app(
        service,
        api_key=api_key,
        art_path=art_path,
        training=training,
        allowed_hosts=allowed_hosts,
        max_body_mb=max_body_mb,
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
    for checkpoints in sorted(art_path.glob("*/models/*/checkpoints")):
        model_dir = checkpoints.parent
        project, name = model_dir.parent.parent.name, model_dir.name
        try:
            store = ModelStore(art_path, project, name)
            # Any PEFT folder named by its step (step.json marks the trainer's own).
            steps = [
                store.checkpoint_dir(step)
                for step in sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
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
    many models were skipped (each logged). A checkpoint that still fails to load stops the
    start with an error naming it and the cause."""
    found, skipped = discover_checkpoints(art_path, base_names)
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


# OpenMP's threads spin while they wait for work (libgomp's default). With another busy process
# on the same cores they spin against it and against each other: measured on 2 cores with one
# busy process, 16 x 64 tokens fell from 130 to 6.5 tok/s; waiting passively held 90 (0.69x of
# quiet) for 8% less when the machine is quiet (BENCHMARKS.md, "under load"). A value the user
# set wins.
OPENMP_WAIT_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def wait_passively_for_work() -> dict[str, str]:
    """Set the OpenMP wait defaults unless the user set them; returns what is in force.

    Must run before torch is imported (libgomp reads its settings when it loads).
    """
    for name, value in OPENMP_WAIT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in OPENMP_WAIT_DEFAULTS}


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run uvicorn until SIGTERM/SIGINT (in-flight requests are drained)."""
    if "torch" not in sys.modules:
        wait_passively_for_work()
    parser = argparse.ArgumentParser(prog="art-server", description=__doc__)
    parser.add_argument(
        "--model", required=True, help="local folder, hub id, or smollm2-135m-instruct"
    )
    parser.add_argument("--name", help="served name of the base model (default: --model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    add_access_arguments(parser, reached="server")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--path", default=".art", type=Path, help="checkpoints folder")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY_MB,
        help="largest request body in MiB (bigger: 413)",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--exit-with-parent",
        type=int,
        metavar="PID",
        help="shut down gracefully when process PID exits (LocalBackend passes its own pid)",
    )
    args = parser.parse_args(argv)
    if args.exit_with_parent:
        _exit_with_parent(args.exit_with_parent)

    from art_backend._host_guard import parse_allowed_hosts
    from art_backend._log_redaction import run_uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # The name the server was bound by is one it answers to (0.0.0.0, :: are not names).
    allowed_hosts = [*parse_allowed_hosts(args.host), *parse_allowed_hosts(args.allowed_hosts)]
    try:
        app = build_app(
            args.model,
            name=args.name,
            dtype=args.dtype,
            device=args.device,
            api_key=args.api_key,
            art_path=args.path,
            max_batch_size=args.max_batch_size,
            allowed_hosts=allowed_hosts,
            max_body_mb=args.max_body_mb,
        )
    except BackendError as error:
        parser.exit(2, f"art-server: error: {error.message}\n")
    run_uvicorn(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=60,
    )


if __name__ == "__main__":
    main()
