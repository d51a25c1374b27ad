"""What a `RayExecutor` call can raise besides the rollout's own exception, in one place.

The rollout's failures: `RolloutExitError` (it raised `SystemExit`, `KeyboardInterrupt`, ...),
`RolloutTimeoutError` (past `timeout`), `RolloutBlockedError` (it held its worker's event loop).
Ray's: `INFRASTRUCTURE_ERRORS` (the worker or its node is gone), `WorkerStartError`,
`NoLiveWorkersError`, `RayAuthenticationError` (the cluster and this driver disagree on
Ray's token), `RayClusterUnreachableError` (nothing answers at the cluster's address). The executor's own: `ExecutorShutdownError`. And how a rollout's own
exception comes out of Ray's wrapper (`user_exception`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import ray.exceptions

# Ray's own failures: the worker or its node is gone, not the rollout's fault.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.ActorDiedError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OwnerDiedError,
    ray.exceptions.RaySystemError,
)


class RolloutExitError(RuntimeError):
    """A rollout raised a BaseException that is not an Exception (`SystemExit`,
    `KeyboardInterrupt`, ...): it is that rollout's failure; the worker goes on.
    `original_type` names what it raised."""

    def __init__(self, message: str, original_type: str = "BaseException") -> None:
        super().__init__(message)
        self.original_type = original_type

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.original_type))


class RolloutTimeoutError(TimeoutError):
    """A rollout ran past the executor's `timeout` and was cancelled on its worker."""


class RolloutBlockedError(RuntimeError):
    """A rollout held its worker's event loop past `heartbeat` (a sync call in an `async def`
    rollout); the worker was replaced."""


class ExecutorShutdownError(RuntimeError):
    """The executor was shut down while this rollout was in flight."""


class WorkerStartError(RuntimeError):
    """A rollout worker died while starting, or did not start within `start_timeout`."""


class RayAuthenticationError(ConnectionError):
    """The Ray cluster and this driver disagree on token authentication (`RAY_AUTH_MODE=token`):
    the cluster refused this machine's token, or this driver sends a token (a `~/.ray/auth_token`
    Ray found) to a cluster whose workers run without one. The message says which and what to
    change."""


class RayClusterUnreachableError(ConnectionError):
    """Nothing answers at the Ray cluster's address (the one given, RAY_ADDRESS, or for "auto"
    the address Ray recorded for the last cluster started on this machine): checked before
    joining, where `ray.init` would retry for as long as Ray's own timeouts let it."""


class NoLiveWorkersError(RuntimeError):
    """Every rollout worker is gone and none could be started again."""


def user_exception(error: ray.exceptions.RayTaskError) -> BaseException:
    """The rollout's own exception, with Ray's remote traceback attached as a note."""
    cause = error.cause
    if not isinstance(cause, BaseException):
        return error
    with contextlib.suppress(Exception):
        cause.add_note(f"raised on a Ray worker:\n{error}")
    return cause


def first_line(error: BaseException) -> str:
    """The error's type and the first line of its message, for a log line."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
