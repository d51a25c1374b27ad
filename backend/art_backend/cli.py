"""`art-server`: serve a base model and its LoRA checkpoints over an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from pathlib import Path

from art_backend._errors import BackendError, InvalidNameError
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
    for adapter_name, adapter_path in discover_checkpoints(art_path):
        engine.load_adapter(adapter_name, adapter_path)
    engine.start()
    base_names = list(dict.fromkeys([served_name, *base_model_aliases(base_model)]))
    records = CompletionRecords()
    service = ChatService(
        engine,
        base_names=base_names,
        records=records,
        grammar_compiler=GrammarCompiler(loaded.tokenizer, loaded.eos_token_ids),
    )
    training = TrainingService(engine, records, art_path=art_path, base_names=base_names)
    return create_app(service, api_key=api_key, art_path=art_path, training=training)


def default_served_name(base_model: str) -> str:
    """A hub id serves under itself; a local folder under the folder's name."""
    if is_served_name(base_model):
        return base_model
    return Path(base_model).expanduser().name or "base"


def discover_checkpoints(art_path: Path, per_model: int = 2) -> list[tuple[str, Path]]:
    """The newest checkpoints of each model under `.art/<project>/models/<name>/checkpoints/<step>/`.

    Returned as (`name@step`, path); older steps stay on disk and load on request (POST /v1/adapters).
    """
    found = []
    for checkpoints in sorted(art_path.glob("*/models/*/checkpoints")):
        steps = sorted(
            path
            for path in checkpoints.iterdir()
            if path.name.isdigit() and (path / "adapter_config.json").is_file()
        )
        for step_dir in steps[-per_model:]:
            found.append((f"{checkpoints.parent.name}@{int(step_dir.name)}", step_dir))
    return found


def _exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """SIGTERM ourselves (a graceful stop) once `parent_pid` is gone: a parent killed without
    running its cleanup (SIGKILL, SIGTERM) must not leave a backend holding memory and cores."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run uvicorn until SIGTERM/SIGINT (in-flight requests are drained)."""
    parser = argparse.ArgumentParser(prog="art-server", description=__doc__)
    parser.add_argument(
        "--model", required=True, help="local folder, hub id, or smollm2-135m-instruct"
    )
    parser.add_argument("--name", help="served name of the base model (default: --model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("ART_API_KEY"))
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--path", default=".art", type=Path, help="checkpoints folder")
    parser.add_argument("--max-batch-size", type=int, default=32)
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

    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        app = build_app(
            args.model,
            name=args.name,
            dtype=args.dtype,
            device=args.device,
            api_key=args.api_key,
            art_path=args.path,
            max_batch_size=args.max_batch_size,
        )
    except BackendError as error:
        parser.exit(2, f"art-server: error: {error.message}\n")
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=60,
    )


if __name__ == "__main__":
    main()
