"""A WAN-like link on this machine: a network namespace behind a veth pair, shaped with ``tc tbf``.

The namespace's side sends through a token-bucket filter (egress = the
learner's uplink); the host side may be shaped too (the downlink). netem
(latency, loss) is not available in every kernel, so only rates are shaped;
callers that want latency get a clear error instead of a silent no-op.
Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ddctl.errors import DdctlError


@dataclass(frozen=True, slots=True)
class ShapedLink:
    namespace: str
    host_ip: str
    peer_ip: str
    up_mbit: float
    down_mbit: float | None

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def available() -> str | None:
    """None when links can be shaped here; otherwise why not."""
    if os.geteuid() != 0:
        return "shaping links needs root (CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"shaping links needs iproute2's {tool!r}"
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise DdctlError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


FRAME_BYTES = 1514
"""The largest packet on these links (a 1500-byte MTU and the Ethernet header); tbf drops a packet over its burst."""
BURST_S = 0.0005
"""The bucket holds this long at rate: what the kernel's timers need to keep up at 1000 Mbit/s (about 85% of it)."""


def tbf_args(rate_mbit: float) -> list[str]:
    """tbf with a burst of 0.5 ms at rate (at least two full-size frames) and 50 ms of queue.

    The burst is credit that an idle link saves up and then spends at the veth's own speed,
    which is memory speed: a bucket much larger than a transfer lets that transfer, and any
    measurement of it, read line rate. A real WAN link has no such credit, so the bucket is
    as small as the kernel allows. The old floor of 16 KiB put a 75 KB update through a
    50 Mbit/s link at 58 Mbit/s; two frames put it through at 48. Above 48 Mbit/s the floor
    gives way to 0.5 ms at rate: a bucket of two frames there starves on timer wake-ups
    (3 KB read 330-670 Mbit/s on a 1000 Mbit/s link), 1 ms reached the rate, 0.5 ms 85% of
    it. The measuring side ignores transfers under 64 KiB (``core/links.py``): at 50 Mbit/s
    the burst is under 5% of any transfer it reads, at 200 Mbit/s under 20%."""
    burst = max(int(rate_mbit * 1e6 / 8 * BURST_S), 2 * FRAME_BYTES)
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]


MAX_MBIT = 100_000.0
"""The fastest link tc is asked to shape (100 Gbit/s); an infinite rate has no token bucket."""


def check_rates(*rates: float | None) -> None:
    """Each given rate (None: not given) a number of Mbit/s tbf can shape; a DdctlError naming them otherwise."""
    if not all(rate is None or 0 < rate <= MAX_MBIT for rate in rates):  # NaN fails too
        given = ", ".join(str(rate) for rate in rates if rate is not None)
        raise DdctlError(f"link rates must be in (0, {MAX_MBIT:g}] Mbit/s, got {given}")


def create_link(name: str, up_mbit: float, down_mbit: float | None = None) -> ShapedLink:
    """Create namespace ``name`` linked to the host through a shaped veth pair; ``destroy_link`` removes it."""
    check_rates(up_mbit, down_mbit)
    why = available()
    if why:
        raise DdctlError(why)
    link = _addresses(name, up_mbit, down_mbit)
    tag = zlib.crc32(name.encode())
    host_if, peer_if = f"dh{tag:08x}", f"dp{tag:08x}"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _run("ip", "link", "set", peer_if, "netns", name)
        _run("ip", "addr", "add", f"{link.host_ip}/24", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run(*link.command("ip", "addr", "add", f"{link.peer_ip}/24", "dev", peer_if))
        _run(*link.command("ip", "link", "set", peer_if, "up"))
        _run(*link.command("ip", "link", "set", "lo", "up"))
        _run(*link.command("tc", "qdisc", "add", "dev", peer_if, "root", *tbf_args(up_mbit)))
        if down_mbit is not None:
            _run("tc", "qdisc", "add", "dev", host_if, "root", *tbf_args(down_mbit))
    except BaseException:
        destroy_link(name)
        raise
    return link


def ensure_link(name: str, up_mbit: float, down_mbit: float | None = None) -> ShapedLink:
    """``create_link`` unless the namespace exists already (its addresses follow from its name)."""
    if name in namespaces(name):
        return _addresses(name, up_mbit, down_mbit)
    return create_link(name, up_mbit, down_mbit)


def _addresses(name: str, up_mbit: float, down_mbit: float | None) -> ShapedLink:
    tag = zlib.crc32(name.encode())
    subnet = f"10.{200 + tag % 50}.{(tag >> 8) % 256}"
    return ShapedLink(name, f"{subnet}.1", f"{subnet}.2", up_mbit, down_mbit)


def destroy_link(name: str) -> None:
    """Remove the namespace and its veth pair; nothing happens if they are gone already."""
    tag = zlib.crc32(name.encode())
    subprocess.run(["ip", "link", "del", f"dh{tag:08x}"], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def namespaces(prefix: str) -> list[str]:
    """Network namespaces whose name starts with ``prefix`` (how ``down`` finds a run's links)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(line.split()[0] for line in listed.splitlines() if line.split() and line.split()[0].startswith(prefix))


@contextmanager
def shaped_link(name: str, up_mbit: float, down_mbit: float | None = None) -> Iterator[ShapedLink]:
    """``create_link`` for the duration of a ``with`` block."""
    link = create_link(name, up_mbit, down_mbit)
    try:
        yield link
    finally:
        destroy_link(name)


def shape_netns_of(pid: int, up_mbit: float, down_mbit: float | None, interface: str = "eth0") -> None:
    """Shape the link of the network namespace ``pid`` lives in (a container): its ``interface``'s egress
    is the uplink; the host end of its veth pair, found by peer index, carries the downlink."""
    why = available()
    if why:
        raise DdctlError(why)
    enter = ["nsenter", "-t", str(pid), "-n"]
    _run(*enter, "tc", "qdisc", "replace", "dev", interface, "root", *tbf_args(up_mbit))
    if down_mbit is None:
        return
    shown = subprocess.run([*enter, "ip", "-o", "link", "show", interface], capture_output=True, text=True).stdout
    peer = shown.split(":", 2)[1].strip().partition("@if")[2] if "@if" in shown else ""
    if not peer.isdigit():
        raise DdctlError(f"cannot find the host end of {interface} in the namespace of pid {pid}: {shown.strip()!r}")
    for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines():
        index, _, rest = line.partition(":")
        if index.strip() == peer:
            host_if = rest.split(":", 1)[0].strip().partition("@")[0]
            _run("tc", "qdisc", "replace", "dev", host_if, "root", *tbf_args(down_mbit))
            return
    raise DdctlError(f"the host end (ifindex {peer}) of {interface} in the namespace of pid {pid} is gone")
