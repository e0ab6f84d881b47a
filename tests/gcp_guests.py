"""The test hypervisor's GCE half: the fake's instances boot for real, as Docker containers of the project's VM image.

The fake (``gcp_cloud``) keeps Compute Engine's books but runs nothing. Each tick this plays them: a RUNNING
instance without a container gets one on the hypervisor's "internet" bridge at its ``natIP`` (where AWS VMs
are too, so learners in one cloud reach a syncer in the other), which runs the ``startup-script`` from its
metadata as GCE's guest agent would, turns the power-off hook's shutdown into ``kill 1`` and execs sshd. A
container that stops is a VM that powered itself off: its console goes to the fake's serial port and the
instance becomes TERMINATED. An instance the fake deleted or stopped (a preemption) loses its container.
The metadata server's ``instance/preempted`` and ``instance/maintenance-event`` answer per caller address.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddctl.providers.docker.engine import Engine, tar_of
from ddctl.providers.docker.image import VmImage
from gcp_cloud import GcpCloud

log = logging.getLogger(__name__)

STARTUP_SCRIPT = "/var/lib/google/startup-script"
POWER_BUTTON = "sed -i -E 's/(exec )?shutdown -h now/kill 1/' /opt/ddctl/poweroff"
SERIAL_CONSOLE = "ln -sf /proc/1/fd/1 /dev/console"
BOOT = f"sh {STARTUP_SCRIPT} && {POWER_BUTTON} && {SERIAL_CONSOLE} && exec /usr/sbin/sshd -D -e"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"
CONSOLE_BYTES = 1024 * 1024
"""GCE keeps the last 1 MB of serial port 1."""


@dataclass
class Guest:
    container: str
    zone: str
    name: str
    address: str


class GcpGuests:
    """Plays the fake's instances as containers on ``network``; ``tick`` is called by the hypervisor's loop."""

    def __init__(
        self, cloud: GcpCloud, engine: Engine, image: VmImage, network: str, labels: dict[str, str],
        shape: Callable[[str, str], None] = lambda region, container: None,
    ) -> None:  # fmt: skip
        self.cloud, self.engine, self.image, self.network, self.labels = cloud, engine, image, network, labels
        self.shape = shape
        """(cloud region, container): shapes a booted VM's link (the hypervisor's)."""
        self._guests: dict[str, Guest] = {}  # "zone/name" -> guest
        self._lock = threading.Lock()

    def tick(self, containers: dict[str, dict[str, Any]], demux: Any) -> None:
        """Bring every container in line with the fake's instances (``containers``: by instance key, from the engine)."""
        instances = {f"{_zone(i)}/{i['name']}": i for i in self.cloud.instances()}
        with self._lock:
            known = dict(self._guests)
        for key, guest in known.items():
            inst = instances.get(key)
            if inst is None or inst.get("status") not in ("PROVISIONING", "STAGING", "RUNNING"):
                log.info("gcp guests: %s is %s; removing its container", key, inst.get("status") if inst else "gone")
                self.engine.remove(guest.container)
                with self._lock:
                    self._guests.pop(key, None)
                continue
            found = containers.get(key)
            if found is None or found["State"] not in ("created", "running"):
                raw = self.engine.http.get(f"/containers/{guest.container}/logs", params={"stdout": 1, "stderr": 1}).content
                self.cloud.set_console(guest.zone, guest.name, demux(raw)[-CONSOLE_BYTES:].decode(errors="replace"))
                log.info("gcp guests: %s powered off", key)
                self.cloud.set_status(guest.zone, guest.name, "TERMINATED")
        for key, inst in instances.items():
            if inst.get("status") == "RUNNING" and key not in known:
                self._boot(key, inst)

    def _boot(self, key: str, inst: dict[str, Any]) -> None:
        zone, name = key.split("/", 1)
        address = next((a.get("natIP") for n in inst.get("networkInterfaces", []) for a in n.get("accessConfigs", [])), None)
        ipaddress.IPv4Address(str(address))  # the fake hands out natIPs on the hypervisor's internet
        metadata = {m["key"]: m.get("value", "") for m in inst.get("metadata", {}).get("items", [])}
        ident = self.engine.create_container(
            f"ddctl-hv-gce-{name}",
            {
                "Image": self.image.ref,
                "Cmd": ["/bin/sh", "-c", BOOT],
                "Hostname": name[:63],
                "Labels": {**self.labels, "ddctl-hv-instance": key},
                "HostConfig": {"Binds": list(self.image.binds), "NetworkMode": self.network},
                "NetworkingConfig": {"EndpointsConfig": {self.network: {"IPAMConfig": {"IPv4Address": address}}}},
            },
        )
        try:
            self.engine.put_archive(ident, tar_of({STARTUP_SCRIPT: (metadata.get("startup-script", "").encode(), 0o700)}))
            self.engine.start(ident)
            self.shape(zone.rsplit("-", 1)[0], ident)
        except BaseException:
            self.engine.remove(ident)
            raise
        with self._lock:
            self._guests[key] = Guest(ident, zone, name, str(address))
        log.info("gcp guests: %s boots at %s", key, address)

    def answer(self, path: str, address: str, flavor: str) -> tuple[int, str] | None:
        """The metadata server's answer to a guest at ``address`` (None: not a GCE path)."""
        if path not in (PREEMPTED_PATH, MAINTENANCE_PATH):
            return None
        if flavor != "Google":
            return 403, "Missing required header: Metadata-Flavor"
        with self._lock:
            guest = next((g for g in self._guests.values() if g.address == address), None)
        if guest is None:
            return 404, "not a GCE instance"
        if path == PREEMPTED_PATH:
            return 200, "TRUE" if self.cloud.preempted(guest.zone, guest.name) else "FALSE"
        return 200, self.cloud.maintenance_event(guest.zone, guest.name)

    def container(self, zone: str, name: str) -> str | None:
        with self._lock:
            guest = self._guests.get(f"{zone}/{name}")
        return guest.container if guest else None


def _zone(inst: dict[str, Any]) -> str:
    return str(inst.get("zone", "")).rstrip("/").rsplit("/", 1)[-1]
