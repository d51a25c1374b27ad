"""Hosts in network namespaces (tests/support/netns.py): skipped, with one line, without root."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import netns


@pytest.fixture(scope="module")
def hosts() -> Iterator[netns.Network]:
    """Three hosts, a, b and c, on one private switch; removed after the module."""
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    netns.sweep_leftovers()
    with netns.network(3) as network:
        yield network
