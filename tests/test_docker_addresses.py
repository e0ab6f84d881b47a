"""A learner VM's address in a Docker dry run is new to the run, as a cloud's replacement VM's is
(``providers/docker/addresses.py``); the Docker test of a replaced relay host shows it end to end
(``tests/test_up_relays.py``)."""

from __future__ import annotations

import ipaddress
import sys
import threading
from pathlib import Path

import pytest

from ddctl.errors import ProvisionError
from ddctl.providers.docker.addresses import LEARNER_HOSTS, fresh_address

NET = ipaddress.IPv4Network("10.213.4.0/24")


def test_a_replacement_gets_an_address_never_handed_in_the_run_not_the_freed_one(tmp_path: Path) -> None:
    handed = tmp_path / "run" / "docker-addresses"
    first = [fresh_address(NET, [], handed) for _ in range(3)]
    assert first == ["10.213.4.2", "10.213.4.3", "10.213.4.4"]
    # the VM at .3 died and was removed: its address is free, but the replacement is given a new one
    assert fresh_address(NET, ["10.213.4.2", "10.213.4.4"], handed) == "10.213.4.5"
    # an address a container holds is never handed, even one this file does not know (made before it existed)
    assert fresh_address(NET, ["10.213.4.6", "10.213.4.7"], handed) == "10.213.4.8"
    assert handed.read_text().split() == [*first, "10.213.4.5", "10.213.4.8"]


def test_once_every_address_was_handed_a_free_one_is_reused_and_a_full_network_is_a_quota_error(tmp_path: Path) -> None:
    handed = tmp_path / "docker-addresses"
    everything = [str(NET[host]) for host in LEARNER_HOSTS]
    handed.write_text("\n".join(everything) + "\n")
    assert fresh_address(NET, everything[:5], handed) == "10.213.4.7"  # the lowest free one
    with pytest.raises(ProvisionError, match=r"every learner address of 10.213.4.0/24 \(.2-.127\) is in use") as full:
        fresh_address(NET, everything, handed)
    assert full.value.kind == "quota"


def test_creations_at_once_are_each_handed_their_own_address(tmp_path: Path) -> None:
    handed, got, lock = tmp_path / "docker-addresses", [], threading.Lock()
    start = threading.Barrier(32)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave between the file's read and its write

    def create() -> None:
        start.wait()
        address = fresh_address(NET, [], handed)
        with lock:
            got.append(address)

    try:
        threads = [threading.Thread(target=create) for _ in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert sorted(got, key=ipaddress.IPv4Address) == [str(NET[host]) for host in range(2, 34)]
