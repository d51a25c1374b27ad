"""Where the training ranks meet (torchrun's variables): a wrong setting fails at start with a
message that names it and says what to set; the interface gloo binds is the one that routes to
rank 0 (on one machine: loopback)."""

from __future__ import annotations

import pytest

from art_backend._errors import InvalidRequestError
from art_backend.training._rendezvous import Rendezvous

RANK_1_OF_2 = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}


def refusal(environment: dict[str, str]) -> str:
    with pytest.raises(InvalidRequestError) as raised:
        Rendezvous.from_environment(environment).gloo_interface()
    return raised.value.message


def test_torchruns_variables_make_a_rendezvous_that_binds_the_interface_routing_to_rank_0():
    rendezvous = Rendezvous.from_environment(RANK_1_OF_2)
    assert (rendezvous.master_addr, rendezvous.master_port) == ("127.0.0.1", 29500)
    assert (rendezvous.rank, rendezvous.world_size) == (1, 2)
    assert rendezvous.gloo_interface() == "lo"
    assert Rendezvous.local(3).gloo_interface() == "lo"  # one machine: as before, loopback


def test_a_missing_variable_is_named_with_what_it_should_be():
    message = refusal({"RANK": "1", "WORLD_SIZE": "2"})
    assert message.startswith("MASTER_ADDR, MASTER_PORT not set")
    assert "rank 0's address, as the other hosts reach it" in message


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"RANK": "2"}, "RANK=2 with WORLD_SIZE=2: ranks are 0 to 1"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000: a TCP port"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two': a whole number"),
        ({"MASTER_ADDR": "no-such-host.invalid"}, "MASTER_ADDR 'no-such-host.invalid' does not"),
        ({"ART_TRAIN_COLLECTIVE_TIMEOUT": "soon"}, "ART_TRAIN_COLLECTIVE_TIMEOUT='soon'"),
        ({"ART_TRAIN_COLLECTIVE_TIMEOUT": "0"}, "ART_TRAIN_COLLECTIVE_TIMEOUT: a positive"),
        ({"GLOO_SOCKET_IFNAME": "eth9"}, "GLOO_SOCKET_IFNAME=eth9 names no interface"),
    ],
)
def test_a_wrong_value_is_refused_by_name(change: dict[str, str], says: str):
    assert says in refusal({**RANK_1_OF_2, **change})
