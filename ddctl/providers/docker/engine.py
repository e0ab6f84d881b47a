"""A small Docker Engine API client: the calls the docker provider needs, over the daemon's Unix socket.

Talking to the Engine API directly (not the ``docker`` CLI) keeps errors
structured and the dependency list short: httpx speaks HTTP over a Unix socket.
Every error names the call and carries the daemon's own message.
"""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, NoReturn, TypeVar

import httpx

from ddctl.errors import EngineError
from ddctl.providers.base import dug
from ddctl.providers.deploy import FILE_LIMIT, TooLarge

DEFAULT_SOCKET = "/var/run/docker.sock"
SPOOL_BYTES = 8 << 20
"""A container file's archive is held in memory up to this size, on disk past it (``get_file``)."""
TAR_FRAMING = 1 << 20
"""What an archive of one file may add to it: headers (a long name's or pax's too) and padding."""

T = TypeVar("T", dict[str, Any], list[Any])


def socket_path() -> str:
    """``DOCKER_HOST=unix://...`` when set, else the default socket."""
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else DEFAULT_SOCKET


def engine_unavailable() -> str | None:
    """None when a Docker engine answers here; otherwise why not (for the dry run's fallback message)."""
    path = socket_path()
    if not Path(path).exists():
        return f"no Docker engine: {path} does not exist (start dockerd, or install Debian's docker.io)"
    try:  # a raw connect first: httpx's Unix transport leaks its socket when the connect is refused (a stale socket file)
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(3.0)
            probe.connect(path)
    except OSError as exc:
        return f"the Docker engine at {path} does not answer: {exc}"
    try:
        with Engine(path, timeout=3.0) as engine:
            engine.ping()
    except EngineError as exc:
        return f"the Docker engine at {path} does not answer: {exc}"
    return None


def _filters(labels: dict[str, str]) -> dict[str, str]:
    return {"filters": json.dumps({"label": [f"{k}={v}" for k, v in labels.items()]})}


def tar_of(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar stream of ``{path: (content, mode)}``, parents first (what ``put_archive`` extracts at /)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


class Engine:
    """Connections are not kept alive: a Unix-socket connect is cheap, and an Engine can then be
    dropped anywhere (providers are made on demand) without leaking a socket."""

    def __init__(self, path: str | None = None, timeout: float = 60.0) -> None:
        transport = httpx.HTTPTransport(uds=path or socket_path(), limits=httpx.Limits(max_keepalive_connections=0))
        self.http = httpx.Client(transport=transport, base_url="http://docker", timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, url: str, ok: Iterable[int] = (200, 201, 204), **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise EngineError(f"docker {method} {url}: {exc}") from None
        if response.status_code not in ok:
            self._refused(method, url, response)
        return response

    @staticmethod
    def _refused(method: str, url: str, response: httpx.Response) -> NoReturn:
        try:
            said = response.json()
        except ValueError:
            said = None
        message = said.get("message", response.text) if isinstance(said, dict) else response.text
        raise EngineError(f"docker {method} {url}: {response.status_code} {str(message)[:300]!r}", response.status_code)

    def _answer(self, method: str, url: str, kind: type[T], **kwargs: Any) -> T:
        """``_call``'s JSON body, of ``kind`` (an object or a list) or an EngineError: an answer of another shape is
        the engine's fault, and the controller's loop goes on past it."""
        return _decoded(self._call(method, url, **kwargs), kind, f"docker {method} {url}")

    def ping(self) -> None:
        self._call("GET", "/_ping")

    # images
    def image_exists(self, ref: str) -> bool:
        return self._call("GET", f"/images/{ref}/json", ok=(200, 404)).status_code == 200

    def import_image(self, rootfs_tar: bytes, repo: str, tag: str) -> None:
        """``docker import``: an image whose only layer is ``rootfs_tar`` (no registry involved)."""
        response = self._call(
            "POST",
            "/images/create",
            params={"fromSrc": "-", "repo": repo, "tag": tag},
            content=rootfs_tar,
            headers={"Content-Type": "application/x-tar"},
        )
        for line in response.text.splitlines():  # progress messages; an error arrives as one of them
            try:
                message = json.loads(line) if line.strip() else {}
            except ValueError:
                message = {"error": f"an answer that is not JSON: {line[:80]!r}"}
            if isinstance(message, dict) and "error" in message:
                raise EngineError(f"docker import {repo}:{tag}: {str(message['error'])[:300]!r}")

    # networks
    def create_network(self, name: str, subnet: str, gateway: str, labels: dict[str, str], ip_range: str = "") -> str:
        pool = {"Subnet": subnet, "Gateway": gateway, **({"IPRange": ip_range} if ip_range else {})}
        body = {
            "Name": name,
            "Driver": "bridge",
            "CheckDuplicate": True,
            "Labels": labels,
            "IPAM": {"Config": [pool]},
        }
        return _ident(self._answer("POST", "/networks/create", dict, json=body))

    def networks(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        return _objects(self._answer("GET", "/networks", list, params=_filters(labels)))

    def all_subnets(self) -> set[str]:
        pools = [c for n in _objects(self._answer("GET", "/networks", list)) for c in (n.get("IPAM") or {}).get("Config") or []]
        return {str(c["Subnet"]) for c in pools if isinstance(c, dict) and "Subnet" in c}

    def remove_network(self, ident: str) -> None:
        self._call("DELETE", f"/networks/{ident}", ok=(204, 404))

    def connect(self, network: str, container: str, ip: str | None) -> None:
        endpoint = {"IPAMConfig": {"IPv4Address": ip}} if ip else {}
        self._call("POST", f"/networks/{network}/connect", json={"Container": container, "EndpointConfig": endpoint})

    def disconnect(self, network: str, container: str) -> None:
        self._call("POST", f"/networks/{network}/disconnect", json={"Container": container, "Force": True})

    # containers
    def container_at(self, labels: dict[str, str], address: str) -> str | None:
        """The id of the labelled container that owns ``address`` (how the metadata endpoint knows its caller)."""
        for c in self.containers(labels):
            networks = dug(c, "NetworkSettings", "Networks")
            if isinstance(networks, dict) and any(dug(net, "IPAddress") == address for net in networks.values()):
                return str(c.get("Id"))
        return None

    def create_container(self, name: str, config: dict[str, Any]) -> str:
        return _ident(self._answer("POST", "/containers/create", dict, params={"name": name}, json=config))

    def put_archive(self, container: str, tar: bytes, path: str = "/") -> None:
        self._call("PUT", f"/containers/{container}/archive", params={"path": path}, content=tar)

    def get_file(self, container: str, path: str, limit: int = FILE_LIMIT) -> bytes | None:
        """One file's bytes out of a container (running or stopped); None if it is not there or is not a regular file
        (a symlink, a directory, a device: the container's to make, and nothing the caller can read as a file).

        A file over ``limit`` bytes is ``TooLarge``: the archive is read as it streams, into a spooled file, and no
        further than the limit and a tar's framing (the engine answered whole, a 20 GiB "summary" was read whole)."""
        url = f"/containers/{container}/archive"
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            try:
                with self.http.stream("GET", url, params={"path": path}) as response:
                    if response.status_code == 404:
                        return None
                    if response.status_code != 200:
                        response.read()
                        self._refused("GET", url, response)
                    for chunk in response.iter_bytes():
                        spool.write(chunk)
                        if spool.tell() > limit + TAR_FRAMING:
                            raise TooLarge(f"{container}:{path}: larger than the {limit} bytes it may be; not read")
            except httpx.HTTPError as exc:
                raise EngineError(f"docker GET {url}: {exc}") from None
            spool.seek(0)
            return _only_file(spool, f"docker GET {path} of {container}", limit)

    def start(self, container: str) -> None:
        self._call("POST", f"/containers/{container}/start", ok=(204, 304))

    def kill(self, container: str, signal: str = "KILL") -> None:
        self._call("POST", f"/containers/{container}/kill", params={"signal": signal}, ok=(204, 404, 409))

    def remove(self, container: str) -> None:
        self._call("DELETE", f"/containers/{container}", params={"force": "true", "v": "true"}, ok=(204, 404))

    def inspect(self, container: str) -> dict[str, Any] | None:
        response = self._call("GET", f"/containers/{container}/json", ok=(200, 404))
        return None if response.status_code == 404 else _decoded(response, dict, f"docker inspect {container}")

    def containers(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Every container with these labels, stopped ones too."""
        return _objects(self._answer("GET", "/containers/json", list, params={"all": "true", **_filters(labels)}))

    def exec_detached(self, container: str, argv: list[str]) -> None:
        """Run ``argv`` inside a running container without waiting for it."""
        ident = _ident(self._answer("POST", f"/containers/{container}/exec", dict, json={"Cmd": argv}))
        self._call("POST", f"/exec/{ident}/start", json={"Detach": True})


def _decoded(response: httpx.Response, kind: type[T], what: str) -> T:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, kind):
        raise EngineError(f"{what}: the answer is not a JSON {kind.__name__}: {response.text[:80]!r}")
    return body


def _objects(items: list[Any]) -> list[dict[str, Any]]:
    """The objects of a list the engine answered; anything else in it is skipped."""
    return [item for item in items if isinstance(item, dict)]


def _ident(answer: dict[str, Any]) -> str:
    ident = answer.get("Id")
    if not isinstance(ident, str) or not ident.isalnum() or len(ident) > 128:
        raise EngineError(f"the engine answered no id: {str(ident)[:80]!r}")
    return ident


def _only_file(archive: IO[bytes], what: str, limit: int) -> bytes | None:
    """The bytes of the first member of a tar ``archive`` if it is a regular file of at most ``limit`` bytes."""
    try:
        with tarfile.open(fileobj=archive) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                return None
            if member.size > limit:
                raise TooLarge(f"{what}: {member.size} bytes, larger than the {limit} bytes it may be; not read")
            extracted = tar.extractfile(member)
            return extracted.read() if extracted is not None else None
    except tarfile.TarError as exc:
        raise EngineError(f"{what}: the answer is not a tar archive ({type(exc).__name__})") from None
