"""A WAN on this machine: one network namespace per region behind a router namespace, each region's link shaped.

Region i's namespace holds its learners and any shard placed there; its one veth
pair to the router is its site link, shaped with ``tc tbf`` both ways (the region
end's egress is the uplink, the router end's egress toward it the downlink). Traffic
between two regions crosses both their links, as on a WAN whose backbone is not the
bottleneck; traffic inside a region crosses none. This machine (the root namespace)
reaches every region through an unshaped management link to the router, for health
probes and status. netem is not available, so latency is not emulated.

The router is a namespace of its own rather than the root namespace: it forwards
with no firewall rules in the way (Docker's FORWARD policy on the root is DROP).
Needs root and iproute2, like ``providers/linkshape.py``, whose tbf settings it uses.
"""

from __future__ import annotations

import json
import subprocess
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from ddctl.errors import DdctlError
from ddctl.providers.linkshape import available, check_rates, tbf_args

MAX_REGIONS = 32


@dataclass(frozen=True, slots=True)
class WanRegion:
    name: str
    namespace: str
    ip: str
    up_mbit: float
    down_mbit: float
    uplink: str
    """The region end of its link (its egress is shaped at the uplink rate), inside ``namespace``."""
    downlink: str
    """The router end (its egress is shaped at the downlink rate), inside the router's namespace."""

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the region."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass(frozen=True, slots=True)
class Wan:
    router: str
    management: str
    """The root namespace's end of the unshaped link to the router."""
    regions: dict[str, WanRegion]

    def sent(self) -> dict[str, tuple[int, int]]:
        """Bytes each region's link has carried so far, (up, down), from the tbf qdiscs' counters."""
        return {
            name: (_qdisc_bytes(r.namespace, r.uplink), _qdisc_bytes(self.router, r.downlink)) for name, r in self.regions.items()
        }


def reshape(wan: Wan, region: str, up_mbit: float, down_mbit: float) -> None:
    """Change a region's link rates mid-run (``tc qdisc change``: the queue and its counters stay)."""
    check_rates(up_mbit, down_mbit)
    r = wan.regions[region]
    _run(*r.command("tc", "qdisc", "change", "dev", r.uplink, "root", *tbf_args(up_mbit)))
    _run("ip", "netns", "exec", wan.router, "tc", "qdisc", "change", "dev", r.downlink, "root", *tbf_args(down_mbit))


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise DdctlError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def _qdisc_bytes(namespace: str, device: str) -> int:
    listed = subprocess.run(
        ["ip", "netns", "exec", namespace, "tc", "-s", "-j", "qdisc", "show", "dev", device], capture_output=True, text=True
    )
    if listed.returncode != 0:
        raise DdctlError(f"reading {device}'s counters in {namespace} failed: {listed.stderr.strip()}")
    qdiscs = [q for q in json.loads(listed.stdout or "[]") if q.get("kind") == "tbf"]
    if not qdiscs:
        raise DdctlError(f"{device} in {namespace} has no tbf qdisc to count")
    return int(qdiscs[0]["bytes"])


def create_wan(prefix: str, links: Mapping[str, tuple[float, float]]) -> Wan:
    """Namespaces ``{prefix}-r`` (the router) and ``{prefix}-0``.. (one per region of ``links``: (up, down) Mbit/s)."""
    if not 1 <= len(links) <= MAX_REGIONS:
        raise DdctlError(f"a WAN has 1..{MAX_REGIONS} regions, got {len(links)}")
    check_rates(*(rate for pair in links.values() for rate in pair))
    why = available()
    if why:
        raise DdctlError(why)
    tag = zlib.crc32(prefix.encode())
    net = f"10.{150 + tag % 50}"
    router, management = f"{prefix}-r", f"w{tag:08x}m"
    regions = {
        name: WanRegion(name, f"{prefix}-{i}", f"{net}.{i}.2", up, down, f"w{tag:08x}u{i}", f"w{tag:08x}d{i}")
        for i, (name, (up, down)) in enumerate(links.items())
    }
    made = Wan(router, management, regions)
    try:
        _run("ip", "netns", "add", router)
        _run("ip", "-n", router, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run("ip", "link", "add", management, "type", "veth", "peer", "name", f"{management}r")
        _run("ip", "link", "set", f"{management}r", "netns", router)
        _run("ip", "addr", "add", f"{net}.250.1/24", "dev", management)
        _run("ip", "link", "set", management, "up")
        _run("ip", "-n", router, "addr", "add", f"{net}.250.2/24", "dev", f"{management}r")
        _run("ip", "-n", router, "link", "set", f"{management}r", "up")
        _run("ip", "route", "add", f"{net}.0.0/16", "via", f"{net}.250.2")
        for i, region in enumerate(regions.values()):
            _add_region(made, region, f"{net}.{i}")
    except BaseException:
        destroy_wan(made)
        raise
    return made


def _add_region(wan: Wan, region: WanRegion, subnet: str) -> None:
    _run("ip", "netns", "add", region.namespace)
    _run("ip", "-n", region.namespace, "link", "set", "lo", "up")
    _run("ip", "link", "add", region.uplink, "type", "veth", "peer", "name", region.downlink)
    _run("ip", "link", "set", region.uplink, "netns", region.namespace)
    _run("ip", "link", "set", region.downlink, "netns", wan.router)
    _run("ip", "-n", region.namespace, "addr", "add", f"{region.ip}/24", "dev", region.uplink)
    _run("ip", "-n", region.namespace, "link", "set", region.uplink, "up")
    _run("ip", "-n", wan.router, "addr", "add", f"{subnet}.1/24", "dev", region.downlink)
    _run("ip", "-n", wan.router, "link", "set", region.downlink, "up")
    _run("ip", "-n", region.namespace, "route", "add", "default", "via", f"{subnet}.1")
    _run(*region.command("tc", "qdisc", "add", "dev", region.uplink, "root", *tbf_args(region.up_mbit)))
    _run("ip", "netns", "exec", wan.router, "tc", "qdisc", "add", "dev", region.downlink, "root", *tbf_args(region.down_mbit))


def destroy_wan(wan: Wan) -> None:
    """Remove every namespace (their veths go with them) and the management link; what is gone already is skipped."""
    for region in wan.regions.values():
        subprocess.run(["ip", "netns", "del", region.namespace], capture_output=True)
    subprocess.run(["ip", "link", "del", wan.management], capture_output=True)
    subprocess.run(["ip", "netns", "del", wan.router], capture_output=True)


@contextmanager
def wan(prefix: str, links: Mapping[str, tuple[float, float]]) -> Iterator[Wan]:
    """``create_wan`` for the duration of a ``with`` block."""
    made = create_wan(prefix, links)
    try:
        yield made
    finally:
        destroy_wan(made)


__all__ = ["Wan", "WanRegion", "create_wan", "destroy_wan", "wan"]
