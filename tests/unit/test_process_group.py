"""Which interface the process group binds to: the one that carries the node's address."""

from __future__ import annotations

import sys

import pytest

from training.process_group import interface_of


@pytest.mark.skipif(sys.platform != "linux", reason="Linux names its loopback interface lo")
def test_the_interface_of_an_address_is_the_one_that_carries_it():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("198.51.100.77") is None  # TEST-NET-2: on no interface of this machine
