"""`LocalBackend`: the backend in a child process on this machine, on a free 127.0.0.1 port.

The user's process stays light (no torch import) and survives a crash of the engine: the next
call raises `BackendCrashedError` naming the log file. The child is started by the first
`register` (it needs the base model's name) and stopped by `close()` or at interpreter exit.

The child writes to `backend.log`; while it starts, its phases are shown on stderr and each
warning it logs (a base model without a chat template, say) is raised here as a
`BackendWarning`, so the person who started it reads it before the first request fails.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import httpx

from art_core._adapter_start import read_adapter_start
from art_core._unknown_fields import check_names
from art_core.backend import ModelRef, RemoteBackend
from art_core.errors import (
    ArtError,
    BackendCrashedError,
    BackendWarning,
    IgnoredSettingWarning,
    UnsupportedOptionError,
)
from art_core.local._buckets import bucket_url, sync

__all__ = ["LocalBackend"]

logger = logging.getLogger("art_core.local")

_START_ATTEMPTS = 3  # a port taken between the probe and the child's bind: another port
_PORT_TAKEN = b"address already in use"
STARTUP_TIMEOUT_SECONDS = 600.0  # the first start may convert the embedded model (~40 s)
_KEYWORDS = ["path", "dtype", "device", "max_batch_size", "chat_template", "extra_args"]
_HINTS = {
    "gpu_cost_per_hour_usd": "Costs here are judges' token prices: art.Model(price=...).",
    "enable_expert_replay": "The engine has no MoE expert replay to turn off.",
}


class LocalBackend(RemoteBackend):
    """Start `art-server` for the model's base model in a child process; talk to it over HTTP."""

    def __init__(
        self,
        path: str | os.PathLike[str] = ".art",
        *,
        dtype: str = "auto",
        device: str = "auto",
        max_batch_size: int | None = None,
        chat_template: str | os.PathLike[str] | None = None,
        extra_args: list[str] | None = None,
        in_process: bool = False,
        **unknown: Any,
    ) -> None:
        """`dtype`, `device`, `max_batch_size`: the engine's (`art-server --dtype ...`; None
        keeps the server's own default batch, 128 rows); a model's `_internal_config` may set
        dtype and max_batch_size where these keep defaults. `chat_template`: a built-in's name
        (`"chatml"`) or a Jinja file, for a base model without one (`art-server --chat-template`).
        `extra_args`: more `art-server` options. ART's `in_process=True` warns and is ignored;
        its other keywords raise UnknownFieldError."""
        check_names("LocalBackend()", unknown, [*_KEYWORDS, "in_process"], hints=_HINTS)
        if in_process:
            # Where the backend runs changes nothing it computes; a child process keeps torch
            # out of the user's process and lets it outlive an engine crash.
            warnings.warn(
                "LocalBackend(in_process=True) is ignored here: the backend always runs in a "
                "child process (art-server on 127.0.0.1), so the client never imports torch and "
                "survives an engine crash; what it computes is the same.",
                IgnoredSettingWarning,
                stacklevel=2,
            )
        super().__init__("http://127.0.0.1:0", api_key=secrets.token_urlsafe(24))
        self.path = Path(path).resolve()
        self.dtype = dtype
        self.device = device
        self.max_batch_size = max_batch_size
        self.chat_template = _template_argument(chat_template)
        self.extra_args = list(extra_args or [])
        self.base_model: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.path / "backend.log"

    async def register(self, model: ModelRef, **options: Any) -> dict[str, Any]:
        start = read_adapter_start(model.base_model)  # a LoRA folder: serve its base model
        base_model = start.base_model if start is not None else model.base_model
        if self.process is None:
            self._apply_engine_settings(getattr(model, "engine_settings", {}))
            await asyncio.to_thread(self._start, base_model)
        elif base_model != self.base_model:
            raise ArtError(
                f"This LocalBackend runs base model {self.base_model!r}; model {model.name!r} "
                f"needs {base_model!r}. Use a second LocalBackend for it."
            )
        return await super().register(model, **options)

    @property
    def _path(self) -> str:
        """ART's `backend._path`: the folder that holds every model's files (`path`)."""
        return str(self.path)

    def _model_folder(self, model: ModelRef) -> Path:
        return self.path / model.project / "models" / model.name

    async def _experimental_push_to_s3(  # type: ignore[override]  # RemoteBackend refuses any
        self,
        model: ModelRef,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
    ) -> None:
        """ART's: copy the model's folder to `<bucket>/<prefix>/<project>/models/<name>/`; the
        bucket is any fsspec URL or folder (default $BACKUP_BUCKET; `art_core.local._buckets`)."""
        folder = self._model_folder(model)
        if not folder.is_dir():
            raise ArtError(f"_experimental_push_to_s3: {model.name!r} has no files in {folder} yet")
        url = bucket_url(folder, model.project, model.name, s3_bucket, prefix)
        copied = await asyncio.to_thread(
            sync, str(folder), url, folder=folder, action="_experimental_push_to_s3", delete=delete
        )
        if verbose:
            logger.info("pushed %d files of %s to %s", copied, folder, url)

    async def _experimental_pull_from_s3(  # type: ignore[override]  # RemoteBackend refuses any
        self,
        model: ModelRef,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
        only_step: int | Literal["latest"] | None = None,
        step: int | None = None,
        exclude: list[str] | None = None,
        latest_only: bool = False,
    ) -> None:
        """ART's: copy the model's folder from the bucket (see `_experimental_push_to_s3`) into
        this backend's folder, before `model.register(backend)` resumes from it. `only_step`
        (or ART's older `step` / `latest_only`): that checkpoint only; `exclude`: parts to skip."""
        if getattr(model, "_backend", None) is not None:
            raise UnsupportedOptionError(
                "_experimental_pull_from_s3: pull before model.register(backend): the backend "
                "has loaded the model's checkpoints already."
            )
        folder = self._model_folder(model)
        url = bucket_url(folder, model.project, model.name, s3_bucket, prefix)
        if only_step is None:
            only_step = "latest" if latest_only else step
        copied = await asyncio.to_thread(
            sync, url, str(folder), folder=folder, action="_experimental_pull_from_s3",
            delete=delete, exclude=exclude, only_step=only_step,
        )  # fmt: skip
        if verbose:
            logger.info("pulled %d files from %s into %s", copied, url, folder)

    def _apply_engine_settings(self, settings: dict[str, Any]) -> None:
        """The first model's `_internal_config` engine settings, where this backend kept defaults."""
        if "dtype" in settings and self.dtype == "auto":
            self.dtype = str(settings["dtype"])
        if "max_batch_size" in settings and self.max_batch_size is None:
            self.max_batch_size = int(settings["max_batch_size"])

    def _start(self, base_model: str) -> None:
        """Start art-server on a free port. The port is free when probed and the child binds it
        seconds later (after loading the model): another process may take it meanwhile, and
        then the child exits on "address already in use" and starts again on another port."""
        self.path.mkdir(parents=True, exist_ok=True)
        atexit.register(self._stop)
        for attempt in range(1, _START_ATTEMPTS + 1):
            offset = self._launch(base_model, _free_port())
            try:
                self._wait_until_healthy(_PhaseLines(self.log_path, offset))
                return
            except BackendCrashedError:
                if attempt == _START_ATTEMPTS or not _lost_its_port(self.log_path, offset):
                    raise
                _say("the port was taken while the backend started; starting it on another")

    def _launch(self, base_model: str, port: int) -> int:
        """Start the child on `port`; the log's offset where its output begins."""
        command = [
            sys.executable, "-m", "art_backend.cli",
            "--model", base_model,
            "--path", str(self.path),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--dtype", self.dtype,
            "--device", self.device,
            "--log-level", "warning",
            "--exit-with-parent", str(os.getpid()),
            *([] if self.max_batch_size is None else ["--max-batch-size", str(self.max_batch_size)]),
            *([] if self.chat_template is None else ["--chat-template", self.chat_template]),
            *self.extra_args,
        ]  # fmt: skip
        # The key goes through the environment, never the command line: `ps` shows any
        # process's command line to every local user; /proc/<pid>/environ only to this one.
        env = {**os.environ, "ART_API_KEY": self._api_key or ""}
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps writing after we return
        offset = log.tell()
        try:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        except OSError as error:
            raise ArtError(f"Could not start the backend ({command[0]}): {error}") from error
        finally:
            log.close()
        self.base_model = base_model
        self.base_url = f"http://127.0.0.1:{port}"
        return offset

    def _wait_until_healthy(self, phases: _PhaseLines) -> None:
        """Poll /health; meanwhile the server's start-up phases are shown on stderr (its own
        output goes to the log file), each with the seconds since the start, and the warnings
        it logs are raised here as BackendWarning."""
        assert self.process is not None
        started = time.monotonic()
        deadline = started + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            phases.show(started)
            if self.process.poll() is not None:
                raise BackendCrashedError(self._exit_message("exited while starting"))
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    phases.show(started)
                    _say(f"backend ready ({time.monotonic() - started:.0f} s)")
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self._stop()
        raise BackendCrashedError(
            f"The backend did not answer within {STARTUP_TIMEOUT_SECONDS:.0f} s; see {self.log_path}"
        )

    def _unreachable(self, error: Exception) -> Exception:
        if self.process is not None and self.process.poll() is not None:
            return BackendCrashedError(self._exit_message("exited"))
        return super()._unreachable(error)

    def _exit_message(self, what: str) -> str:
        assert self.process is not None
        tail = _tail(self.log_path, 15)
        # The server says why it refused to start on one line: that is the cause, and starting
        # again would fail the same way, so it leads the message and no restart is advised.
        last = (tail.strip().splitlines() or [""])[-1]
        if last.startswith("art-server: error:"):
            return (
                f"The backend process {what} (exit code {self.process.returncode}): "
                f"{last.removeprefix('art-server: error:').strip()}\n"
                f"Its log is {self.log_path}; last lines:\n{tail}"
            )
        return (
            f"The backend process {what} (exit code {self.process.returncode}). "
            f"Its log is {self.log_path}; last lines:\n{tail}\n"
            "Checkpoints on disk are intact: start a new LocalBackend and register the model to resume."
        )

    def _stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __reduce__(self) -> tuple[type[RemoteBackend], tuple[str, str | None]]:
        """Pickled as a RemoteBackend on the running server: a rollout worker in another process
        reaches the same server, and the child process stays this process's to stop."""
        return RemoteBackend, (self.base_url, self._api_key)

    def __enter__(self) -> LocalBackend:
        """ART's `with LocalBackend() as backend:`; leaving the block stops the backend."""
        return self

    def __exit__(self, *exc: object) -> None:
        """As `close()`, from synchronous code (inside a running event loop too)."""
        http, self._http = self._http, None
        if http is not None:
            try:
                self._closing = asyncio.get_running_loop().create_task(http.aclose())
            except RuntimeError:  # no running loop
                asyncio.run(http.aclose())
        self._stop()

    async def close(self) -> None:
        """Close the HTTP client and stop the child process (in-flight requests drain first)."""
        await super().close()
        await asyncio.to_thread(self._stop)


class _PhaseLines:
    """What the server writes to its log from `offset` on that its user must see while it
    starts: its `art-server: <phase>` lines (shown on stderr; not its `art-server: error:` line,
    which the crash message quotes), and its warnings (raised as BackendWarning)."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self.offset = offset
        self._partial = b""

    def show(self, started: float) -> None:
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            # A progress bar redraws its line with \r and may not end it: the text after it.
            line = raw.decode(errors="replace").rsplit("\r", 1)[-1].strip()
            if line.startswith(_PHASE) and not line.startswith(f"{_PHASE}error:"):
                _say(f"{line.removeprefix(_PHASE)} ({time.monotonic() - started:.0f} s)")
            elif _PORT_TAKEN.decode() in line:
                continue  # `_start` starts the child again on another port, or quotes it
            elif (warning := _warning_in(line)) is not None:
                # Named after the log (line 0: no source line to quote), each shown every time.
                warnings.warn_explicit(
                    f"art-server: {warning}",
                    BackendWarning,
                    filename=str(self.path),
                    lineno=0,
                    module=__name__,
                )


_PHASE = "art-server: "  # art_backend._phases.PREFIX (the client does not import the backend)
# A record of the server's logging ("WARNING art_backend.cli: text", its format, or uvicorn's
# "WARNING:  text") at warning level or above, and a Python warning it printed
# ("path.py:12: FutureWarning: text").
_LOGGED = re.compile(r"(?:WARNING|ERROR|CRITICAL)(?: [\w.]+:|:) +(?P<text>\S.*)")
_PYTHON_WARNING = re.compile(r"\S.*:\d+: (?P<text>[A-Z]\w*Warning: \S.*)")


def _warning_in(line: str) -> str | None:
    """The warning a line of the server's log says, if it says one."""
    match = _LOGGED.fullmatch(line) or _PYTHON_WARNING.fullmatch(line)
    return match["text"] if match else None


def _say(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


def _template_argument(chat_template: str | os.PathLike[str] | None) -> str | None:
    """A built-in template's name as given; a file's path made absolute (the server resolves
    it, and a relative path would not survive a change of working folder before the start)."""
    if chat_template is None:
        return None
    path = Path(chat_template).expanduser()
    return str(path.resolve()) if path.is_file() else str(chat_template)


def _lost_its_port(log_path: Path, offset: int) -> bool:
    """Whether the child's output from `offset` on says its port was taken (errno 98)."""
    try:
        with log_path.open("rb") as log:
            log.seek(offset)
            return _PORT_TAKEN in log.read()
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
