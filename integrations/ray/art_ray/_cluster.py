"""What the executor asks the Ray cluster itself: to join it (and whether it accepts this
driver's token), whether the resources the workers need exist, whether every node is on loopback
(`art_ray.testing`'s clusters), whether a node still runs tasks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

import ray
import ray.exceptions

from art_ray._errors import (
    INFRASTRUCTURE_ERRORS,
    RayAuthenticationError,
    RayClusterUnreachableError,
)

# How long a first task may take to run on a freshly joined cluster before the token check
# gives up asking (a busy cluster: the executor's own `start_timeout` takes over).
TOKEN_CHECK_SECONDS = 60.0
# What Ray's GCS answers a connection whose token it does not accept (Ray 2.5x-2.6x).
_REFUSED_TOKEN = ("Unauthenticated", "InvalidAuthToken")
# How long the cluster's address may take to accept a TCP connection before joining gives up.
CONNECT_SECONDS = 10.0


def join(address: str | None) -> None:
    """`ray.init(address)`, with a disagreement on Ray's token raised as
    `RayAuthenticationError` instead of a timeout or dying workers."""
    # Ray sets RAY_AUTH_MODE=token itself when it finds a token file: read it before.
    mode_set_by_user = "RAY_AUTH_MODE" in os.environ
    resolved = _check_reachable(address)
    if resolved is not None:
        _check_token_at(resolved)  # 0.3 s where ray.init takes 20 s to give up
    try:
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as error:
        if any(word in _chain_text(error) for word in _REFUSED_TOKEN):
            raise _refused(address) from None
        raise
    if _token_mode():
        try:
            _check_token_accepted(mode_set_by_user)
        except BaseException:
            ray.shutdown()
            raise


def _refused(address: str | None) -> RayAuthenticationError:
    return RayAuthenticationError(
        f"the Ray cluster at {address or 'the local address'} refused this driver's "
        f"authentication token ({_token_source()}). Give this machine the cluster's "
        "token: the head's ~/.ray/auth_token copied to ~/.ray/auth_token here, or "
        "RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH (see `ray get-auth-token`)"
    )


def _check_token_at(resolved: str) -> None:
    """Ask the cluster's GCS once, with this driver's token: a token it refuses raises
    `RayAuthenticationError` now (Ray's own client, private API: skipped where it differs)."""
    try:
        import ray._raylet

        raylet: Any = ray._raylet  # the stubs lack GcsClient
        raylet.GcsClient(address=resolved).internal_kv_get(b"art-token-check", None, timeout=10)
    except (ImportError, AttributeError, TypeError):
        return
    except Exception as error:  # noqa: BLE001 - only a refused token is ours to report
        if any(word in _chain_text(error) for word in _REFUSED_TOKEN):
            raise _refused(resolved) from None


def _check_reachable(address: str | None) -> str | None:
    """The cluster's address as Ray resolves it (None where Ray starts or finds its own);
    `RayClusterUnreachableError` when it refuses a TCP connection or lets it time out:
    `ray.init` would retry it for minutes, and after a cluster of this machine went away,
    "auto" still resolves to its address."""
    if address is None or address.startswith(("ray://", "local")):
        return None  # a new local Ray, or Ray Client: ray.init reports those itself
    try:
        from ray._private.services import canonicalize_bootstrap_address

        resolved = canonicalize_bootstrap_address(address)
    except (ImportError, AttributeError, ValueError):
        return None  # a Ray without this helper, or an address Ray itself will refuse by name
    except ConnectionError:
        return None  # "auto" and no cluster recorded: ray.init says so itself, at once
    if resolved is None:
        return None
    host, _, port = resolved.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS):
            return resolved
    except (OSError, ValueError) as error:
        where = "" if address == resolved else f" ({address!r} resolved to it)"
        raise RayClusterUnreachableError(
            f"no Ray cluster answers at {resolved}{where}: {error}. Start the cluster (`ray "
            "start --head` on its head), or name the running one with address= or "
            'RAY_ADDRESS; for "auto", Ray uses the address of the last cluster `ray start` '
            "ran on this machine, which may have stopped since"
        ) from None


def _check_token_accepted(mode_set_by_user: bool) -> None:
    """A driver in token mode whose cluster runs without tokens connects, and runs tasks, but
    every actor it starts dies at once (measured on Ray 2.60): start one to see."""
    actor = _TokenProbe.remote()  # type: ignore[attr-defined]
    try:
        ray.get(actor.ready.remote(), timeout=TOKEN_CHECK_SECONDS)
    except ray.exceptions.GetTimeoutError:
        pass  # a busy cluster: nothing learnt, the executor's start_timeout takes over
    except INFRASTRUCTURE_ERRORS as error:
        why = (
            f"Ray turned token authentication on by itself because it found {_token_source()} "
            "(RAY_AUTH_MODE is unset): a token left by another Ray run"
            if not mode_set_by_user
            else f"RAY_AUTH_MODE=token here ({_token_source()})"
        )
        raise RayAuthenticationError(
            "this driver sends a Ray authentication token, but the cluster's workers die on "
            f"it ({type(error).__name__}): the cluster runs without token authentication. "
            f"{why}. Set RAY_AUTH_MODE=disabled (or remove the stale token file) to join this "
            "cluster, or restart the cluster with RAY_AUTH_MODE=token and this token"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


@ray.remote(num_cpus=0, max_restarts=0)
class _TokenProbe:
    def ready(self) -> bool:
        return True


def _token_mode() -> bool:
    """Whether this driver authenticates with a token (Ray's private switch; False where a Ray
    version lacks it)."""
    with contextlib.suppress(ImportError, AttributeError):
        import ray._raylet

        raylet: Any = ray._raylet  # the stubs lack the authentication switch
        return bool(raylet.get_authentication_mode() == raylet.AuthenticationMode.TOKEN)
    return False


def _token_source() -> str:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the token in RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return f"the token in {path}"


def _chain_text(error: BaseException) -> str:
    texts: list[str] = []
    seen: BaseException | None = error
    while seen is not None and len(texts) < 10:
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return "\n".join(texts)


def check_resources(resources: dict[str, float], num_cpus: float) -> None:
    """A resource no node has would leave the workers pending forever: say so now."""
    available = ray.cluster_resources()
    missing = [name for name in resources if name not in available]
    if missing:
        have = ", ".join(sorted(k for k in available if not k.startswith("node:"))) or "none"
        example = f'{{"{missing[0]}": 8}}'
        how = (
            # Every node on loopback: art_ray.testing.local_cluster (ray start cannot).
            f"start the local cluster with `local_cluster(..., node_resources={example})` "
            "(its worker nodes carry them)"
            if loopback_cluster()
            else f"start the rollout nodes with `ray start --resources='{example}'`"
        )
        raise ValueError(
            f"no node in the Ray cluster has the resource(s) {', '.join(missing)} "
            f"(the cluster has: {have}); {how}, or drop resources="
        )
    if num_cpus > available.get("CPU", 0):
        raise ValueError(
            f"num_cpus={num_cpus} per worker, but the cluster has {available.get('CPU', 0)} CPUs"
        )


def loopback_cluster() -> bool:
    """Whether every node of the cluster listens on 127.0.0.1 (`art_ray.testing`'s clusters)."""
    with contextlib.suppress(Exception):
        addresses = {node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
        return addresses == {"127.0.0.1"}
    return False


async def node_answers(node_id: str) -> bool:
    """Whether a fresh task pinned to the node runs there within seconds."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = _probe.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote()
    try:
        await asyncio.wait_for(asyncio.ensure_future(probe), 5.0)
    except (TimeoutError, ray.exceptions.RayError):
        ray.cancel(probe, force=True)
        return False
    return True


@ray.remote(num_cpus=0, max_retries=0)
def _probe() -> bool:
    return True
