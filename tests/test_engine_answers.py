"""The Docker engine's answers are checked in shape before the provider acts on them: one of another shape is an
EngineError (a DdctlError: the controller tries again next pass), never a KeyError, AttributeError or TarError that
ended the controller, and a container's address is an IPv4 address before it becomes a pinned known_hosts line
(found by a hostile-input audit of the answers the tools act on). The engine is an httpx MockTransport."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ddctl.errors import DdctlError, EngineError
from ddctl.providers.base import Instance
from ddctl.providers.docker.engine import Engine
from ddctl.providers.docker.vms import DockerProvider, _address_on


def engine_answering(status: int, body: bytes) -> Engine:
    engine = Engine.__new__(Engine)
    engine.http = httpx.Client(
        transport=httpx.MockTransport(lambda _: httpx.Response(status, content=body)), base_url="http://docker"
    )
    return engine


CALLS: dict[str, Callable[[Engine], Any]] = {
    "containers": lambda e: e.containers({"ddctl-run": "r"}),
    "networks": lambda e: e.networks({"ddctl-run": "r"}),
    "inspect": lambda e: e.inspect("abc"),
    "create_container": lambda e: e.create_container("n", {}),
    "get_file": lambda e: e.get_file("abc", "/s.json"),
    "import_image": lambda e: e.import_image(b"", "repo", "tag"),
}


@pytest.mark.parametrize(
    ("call", "status", "body", "says"),
    [
        ("containers", 200, b"<html>proxy</html>", "the answer is not a JSON list"),
        ("containers", 200, b'{"message": "hi"}', "the answer is not a JSON list"),
        ("networks", 200, b"null", "the answer is not a JSON list"),
        ("inspect", 200, b"[]", "the answer is not a JSON dict"),
        ("create_container", 201, b'{"Id": "abc\\n2026 INFO forged"}', "the engine answered no id"),
        ("containers", 500, b"[]", "500 '[]'"),
        ("containers", 500, b'"boom\\n2026 INFO forged"', "500 '\"boom\\\\n2026 INFO forged\"'"),
        ("get_file", 200, b"not a tar archive", "the answer is not a tar archive"),
        ("import_image", 200, b"{}\nnot json\n", "docker import repo:tag: \"an answer that is not JSON: 'not json'\""),
        ("import_image", 200, b"7\n", None),  # a progress line of another shape is no error
    ],
)
def test_an_answer_of_another_shape_is_an_engine_error(call: str, status: int, body: bytes, says: str | None) -> None:
    engine = engine_answering(status, body)
    if says is None:
        CALLS[call](engine)
        return
    with pytest.raises(EngineError) as raised:
        CALLS[call](engine)
    assert says in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


def test_listed_containers_without_labels_or_id_are_skipped() -> None:
    good = {"Id": "abc", "Labels": {"ddctl-name": "L0", "ddctl-region": "east"}, "State": "running"}
    listed = [good, {"Id": "def", "Labels": None, "State": "running"}, {"Labels": {"ddctl-name": "L1"}}, 5]
    provider = DockerProvider.__new__(DockerProvider)
    provider.engine = engine_answering(200, json.dumps(listed).encode())
    assert [(i.name, i.provider_id, i.alive) for i in provider.list_run("r")] == [("L0", "abc", True)]


@pytest.mark.parametrize("answered", ["* ssh-ed25519 AAAAC3Nza attacker\n10.213.0.5", None, "10.213.0.300", 5])
def test_a_containers_address_must_be_ipv4_before_it_is_pinned_or_dialled(answered: object) -> None:
    """An address with a newline wrote a wildcard pin for a foreign key into the run's known_hosts."""
    info = {"NetworkSettings": {"Networks": {"net": {"IPAddress": answered}}}}
    with pytest.raises(EngineError, match="the engine answered no IPv4 address for the container on net"):
        _address_on(info, "net")
    assert _address_on({"NetworkSettings": {"Networks": {"net": {"IPAddress": "10.213.0.5"}}}}, "net") == "10.213.0.5"


@pytest.mark.parametrize(
    "info",
    [
        {"NetworkSettings": {"Networks": {"net": ["10.213.0.5"]}}},
        {"NetworkSettings": ["net"]},
        {"NetworkSettings": {"Networks": "net"}},
        {},
    ],
)
def test_a_containers_networks_of_another_shape_are_no_address(info: dict[str, Any]) -> None:
    """A level of another shape was an AttributeError out of the provider (and the controller's pass)."""
    with pytest.raises(EngineError, match="the engine answered no IPv4 address for the container on net: 'None'"):
        _address_on(info, "net")


def provider_answering(body: object) -> DockerProvider:
    provider = DockerProvider.__new__(DockerProvider)
    provider.engine = engine_answering(200, json.dumps(body).encode())
    return provider


HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAknQxho8mOTK2n+7SZXAhF2rWcVg9Rmmf1ZVihJcoId"
RUNNING = {
    "State": {"Running": True, "Pid": 42},
    "Config": {"Labels": {"ddctl-region": "east", "ddctl-host-key": HOST_KEY}},
    "NetworkSettings": {"Networks": {"ddctl-r-east": {"IPAddress": "10.213.0.5"}}},
}


def test_the_ssh_target_pins_only_an_ed25519_line_the_engine_answers() -> None:
    instance = Instance(name="L0", provider_id="abc", run="r", alive=True, address="10.213.0.5")
    target = provider_answering(RUNNING).ssh_target(instance)
    assert (target.host, target.host_key) == ("10.213.0.5", HOST_KEY)
    forged = f"{HOST_KEY}\n* ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAttacker"
    for labels in ({"ddctl-region": "east", "ddctl-host-key": forged}, {"ddctl-region": "east"}, ["east"], None):
        with pytest.raises(EngineError, match="the engine answered L0 without its region or a host key to pin"):
            provider_answering({**RUNNING, "Config": {"Labels": labels}}).ssh_target(instance)
    for state in ({"Running": "yes"}, "running", None):
        with pytest.raises(DdctlError, match="L0 is not running"):
            provider_answering({**RUNNING, "State": state}).ssh_target(instance)


def test_networks_and_containers_of_another_shape_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    good = {"Labels": {"ddctl-region": "east"}, "IPAM": {"Config": [{"Subnet": "10.213.4.0/24"}]}}
    odd = [
        {"Labels": {"ddctl-region": "west"}, "IPAM": {"Config": {"Subnet": "10.213.5.0/24"}}},
        {"Labels": ["west"], "IPAM": {"Config": [{"Subnet": "10.213.5.0/24"}]}},
        {"Labels": {"ddctl-region": "west"}, "IPAM": {"Config": [{"Subnet": "10.213.5.300/24"}]}},
        {"Labels": {"ddctl-region": "west"}, "IPAM": {"Config": ["10.213.5.0/24"]}},
    ]
    assert provider_answering([good, *odd]).subnets("r") == {"east": ipaddress.IPv4Network("10.213.4.0/24")}
    assert sum("the engine listed a network of run r without its region or subnet" in m for m in caplog.messages) == 4
    containers = [{"Id": "abc", "NetworkSettings": {"Networks": ["x"]}}, {"Id": "def", "NetworkSettings": {"Networks": {"n": 5}}}]
    assert provider_answering(containers).engine.container_at({"ddctl-run": "r"}, "10.213.0.5") is None
    held = [*containers, {"NetworkSettings": {"Networks": {"n": {"IPAddress": "10.213.0.9"}}}}]
    assert provider_answering(held)._held("r", "n") == ["10.213.0.9"]
