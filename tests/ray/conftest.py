"""One loopback Ray cluster per test module (`art_ray.testing.local_cluster`: a head and two
worker nodes on 127.0.0.1, each worker node with the custom resource `art_rollout`).

The cluster and the driver run with a HOME of their own and token authentication off, set
before Ray starts: a token another Ray run left in the real `~/.ray/auth_token` would otherwise
turn token mode on in the driver alone (Ray does so when it finds one), and every worker would
die (issue 54); and nothing these tests start writes into the real home."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the [ray] extra is not installed")

from art_ray.testing import local_cluster

REPO = Path(__file__).resolve().parents[2]
# The repository first, then the driver's own path (a checkout's packages over the installed ones).
WORKER_PYTHONPATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="module")
def ray_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A HOME of the module's own and `RAY_AUTH_MODE=disabled` while its cluster runs."""
    settings = {"HOME": str(tmp_path_factory.mktemp("ray-home")), "RAY_AUTH_MODE": "disabled"}
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def cluster(ray_settings: None) -> Iterator[Any]:
    """A head (1 CPU) and two worker nodes (1 CPU, `art_rollout: 1` each); the driver joined."""
    import ray

    # Ray's socket paths must stay under 107 bytes: a short folder of its own, not tmp_path.
    with (
        tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as tmp,
        local_cluster(nodes=2, tmp_dir=tmp, node_resources={"art_rollout": 1}) as running,
    ):
        # The workers import the tests' rollout functions (tests.support.rollouts) by name.
        ray.init(
            address=running.address,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": WORKER_PYTHONPATH}},
        )
        yield running
