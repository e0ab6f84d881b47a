"""A region's relay: it pulls each fragment version into the region once and serves it to the region's learners.

Where it is travels with it: a relay tells each shard the address its region's
learners reach it at (``at=`` on its fragment stream), and a learner whose relay
stopped answering asks a shard (``GET /v1/relay``), so a relay whose host was
replaced by a machine at another address is found again without restarting
anyone. The address needs no trust: learners check the relay's certificate by
its region's name, whatever address they reach it at.
"""

import ipaddress
import re
import socket
from urllib.parse import urlsplit

PREFIX = "relay-"
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
WILDCARD = ("", "0.0.0.0", "::")


def identity(region: str) -> str:
    """Who region ``region``'s relay is to the shards (its token's identity): ``relay-REGION``."""
    return f"{PREFIX}{region}"


def region_of(who: str) -> str | None:
    """The region whose relay ``who`` is, or None for anyone else."""
    return who[len(PREFIX) :] if who.startswith(PREFIX) and len(who) > len(PREFIX) else None


def server_name(region: str) -> str:
    """The one name region ``region``'s relay certificate carries, which its learners check (``sni_hostname``): the
    relay's address is not known when the job's certificates are made, and need not be."""
    return f"relay.{region}.ddctl"


def address(text: str, role: str = "relay") -> str:
    """``text`` as a relay's (or another ``role``'s) address, ``HOST:PORT`` (an IPv6 host in brackets), normalised;
    ValueError says what is allowed. It is what another process sent, so it is checked before it is stored or dialled."""
    if not isinstance(text, str) or len(text) > 300:
        raise ValueError(f"a {role}'s address must be HOST:PORT, at most 300 characters")
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"a {role}'s address must be HOST:PORT with a port from 1 to 65535, got {text[:60]!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        if bracketed or not HOSTNAME.fullmatch(host):  # fullmatch: ``$`` alone lets a trailing newline through
            raise ValueError(f"a {role}'s host must be an IP address or a DNS name, got {host[:60]!r}") from None
        return f"{host.lower()}:{int(port)}"
    if ip.version == 6 and not bracketed:
        raise ValueError(f"an IPv6 host goes in brackets, [{host}]:{port}")
    if ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"{ip} is not an address a learner can reach a {role} at")
    return f"[{ip}]:{int(port)}" if ip.version == 6 else f"{ip}:{int(port)}"


def on_loopback(normal: str) -> bool:
    """Whether a normalised ``HOST:PORT`` (``address``) is on a loopback address: the only place a relay serves in
    plain text (``relay/serve.py`` refuses any other), so the only place a plaintext link may be sent to."""
    host = normal.rpartition(":")[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url(text: str) -> str:
    """``text`` as the relay URL a learner is started with: ``https://HOST:PORT``, or ``https://:PORT`` while the
    relay's host is not known yet (``ddctl.control.specs.with_relay``); normalised. ValueError says what is allowed,
    at start, rather than in the stream's thread at its first connection."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("https", "http") or "/" in rest:
        raise ValueError(f"a relay URL is https://HOST:PORT (or https://:PORT before its host is known), got {text[:60]!r}")
    if rest.startswith(":"):
        port = rest[1:]
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise ValueError(f"a relay URL's port must be from 1 to 65535, got {text[:60]!r}")
        return f"{scheme}://:{int(port)}"
    return f"{scheme}://{address(rest)}"


def own_address(bind_host: str, port: int, shard_url: str) -> str:
    """The address this machine's learners reach a relay bound to ``bind_host``:``port`` at: that host, or for a
    wildcard bind the local address of this machine's route to the shard (its private address on a cloud VM: the
    public one is the cloud's NAT, outside the machine). Nothing is sent to find the route."""
    host = bind_host.strip("[]")
    return address(host_port(_route_to(shard_url) if host in WILDCARD else host, port))


def host_port(host: str, port: int | str) -> str:
    """HOST:PORT, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _route_to(shard_url: str) -> str:
    """The local address of this machine's route to ``shard_url``'s host."""
    shard = urlsplit(shard_url)
    try:
        family, kind, proto, _, target = socket.getaddrinfo(shard.hostname, shard.port or 443, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(target)
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise ValueError(
            f"no route from this machine to {shard_url} to take its address from ({exc}); give --advertise"
        ) from None
