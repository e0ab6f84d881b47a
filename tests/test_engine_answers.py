"""The Docker engine's answers are checked in shape before the provider acts on them: one of another shape is an
EngineError (a DdctlError: the controller tries again next pass), never a KeyError, AttributeError or TarError that
ended the controller, and a container's address is an IPv4 address before it becomes a pinned known_hosts line
(found by a hostile-input audit of the answers the tools act on). The engine is an httpx MockTransport."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ddctl.errors import EngineError
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
