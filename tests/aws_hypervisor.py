"""A test hypervisor: moto's EC2 instances boot for real, as Docker containers of the project's VM image.

Moto keeps EC2's books but runs nothing, so the AWS provider's deploy (SSH, SFTP), training and spot-notice
paths would never run. A daemon thread polls moto and plays the machines: each pending or running instance
becomes a container of the docker provider's VM image on one bridge playing the internet (100.100.0.0/16,
where AwsCloud draws public IPs), at the instance's public IP, followed when an Elastic IP is associated.
Boot runs the user data as cloud-init would, turns ``/opt/ddctl/poweroff`` into ``kill 1`` (the power
button: pid 1 is sshd) and execs sshd. A container that stops gets its instance terminated in moto
(InstanceInitiatedShutdownBehavior=terminate); an instance terminated in moto loses its container.

Spot interruptions come through the real FIS API: each new experiment's ``send-spot-instance-interruptions``
(``fis_experiments.py``) posts the notice on an IMDSv2 endpoint at 169.254.169.254 (``hv_metadata.py``: the docker
provider's handler, callers known by source address); when ``durationBeforeInterruption`` runs out the container is
killed and the instance terminated. Needs root (an address on ``lo``, port 80) and Docker; one Hypervisor per machine at a time
(a lock file: the network and the address are machine-wide). Given a ``gcp`` fake too, it plays GCE's
instances on the same bridge (``gcp_guests.py``) and its metadata server answers GCE's paths, so one job
can span both clouds.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import ipaddress
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from ddctl.providers import linkshape
from ddctl.providers.docker import metadata
from ddctl.providers.docker.engine import Engine, tar_of
from ddctl.providers.docker.image import VmImage, ensure_image
from ddctl_agents.waiting import wait_until
from fis_experiments import interruptions
from gcp_cloud import GcpCloud
from gcp_guests import GcpGuests
from hv_metadata import IMDS_ADDRESS, metadata_handler

log = logging.getLogger(__name__)

HV_LABEL = "ddctl-hv"
"""On everything the hypervisor makes (value "1"), so a crashed session's leftovers are found and removed."""
INSTANCE_LABEL, RUN_LABEL, NAME_LABEL = "ddctl-hv-instance", "ddctl-hv-run", "ddctl-hv-name"
NETWORK = "ddctl-hv-internet"
INTERNET = ipaddress.IPv4Network("100.100.0.0/16")
GATEWAY = "100.100.0.1"
USER_DATA = "/var/lib/cloud/user-data"
POWER_BUTTON = "sed -i -E 's/(exec )?shutdown -h now/kill 1/' /opt/ddctl/poweroff"
"""The OS's shutdown becomes the container's end (pid 1 is sshd); whatever the hook does before it stays."""
SERIAL_CONSOLE = "ln -sf /proc/1/fd/1 /dev/console"
"""The serial console is the container's output: what the VM prints there, EC2's GetConsoleOutput returns."""
BOOT = f"sh {USER_DATA} && {POWER_BUTTON} && {SERIAL_CONSOLE} && exec /usr/sbin/sshd -D -e"
RUNNING = ("pending", "running")
CONSOLE_BYTES = 64 * 1024
"""EC2 keeps the last 64 KB of a VM's console."""
LOCK = Path("/tmp/ddctl-hv.lock")


class Cloud(Protocol):
    def client(self, service: str, region: str) -> Any: ...


@dataclass
class Vm:
    container: str
    region: str
    address: str


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


class Hypervisor:
    """Plays moto's instances in ``regions`` as containers until ``stop()``; ``errors`` keeps what failed, by subject."""

    def __init__(
        self, cloud: Cloud, regions: Iterable[str] = ("us-east-1",), every_s: float = 0.2, gcp: GcpCloud | None = None,
        links: dict[str, tuple[float, float]] | None = None,
    ) -> None:  # fmt: skip
        self.cloud, self.regions, self.every_s, self.gcp = cloud, list(regions), every_s, gcp
        self.links = dict(links or {})
        """Cloud region -> (up, down) Mbit/s every VM booted there is shaped to (tc tbf, as the docker provider's VMs)."""
        self.shaped: dict[str, tuple[float, float]] = {}
        """Container -> the (up, down) Mbit/s it was shaped to."""
        self.guests: GcpGuests | None = None
        self.engine = Engine()
        self.notices = metadata.Notices(self._instance_at)
        self.errors: dict[str, str] = {}
        self._vms: dict[str, Vm] = {}
        self._rebalances: dict[str, str] = {}
        self._deadlines: dict[str, tuple[float, str]] = {}  # instance -> (monotonic kill time, region)
        self._experiments: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._imds: ThreadingHTTPServer | None = None
        self._added_address = False
        self._lockfile: Any = None
        self._clients: dict[tuple[str, str], Any] = {}
        self.image: VmImage | None = None

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> Hypervisor:
        lockfile = LOCK.open("w")
        try:
            wait_until(
                partial(_try_lock, lockfile), timeout_s=300, every_s=0.5, what=f"another test hypervisor to let go of {LOCK}"
            )
        except BaseException:
            lockfile.close()
            raise
        self._lockfile = lockfile
        try:
            self._remove_all()  # a crashed session's leftovers: we hold the lock, nobody else owns them
            self.image = ensure_image(self.engine)
            self.engine.create_network(NETWORK, str(INTERNET), GATEWAY, {HV_LABEL: "1"})
            if self.gcp is not None:
                self.guests = GcpGuests(self.gcp, self.engine, self.image, NETWORK, {HV_LABEL: "1"}, self.shape)
            self._serve_imds()
            self._clients = {(s, r): self.cloud.client(s, r) for s in ("ec2", "fis") for r in self.regions}
        except BaseException:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._loop, name="aws-hypervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and serving; remove every container and the network; give back the address and the lock."""
        if self._lockfile is None:
            return  # never started (or stopped already): what is there belongs to someone else
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._imds is not None:
            self._imds.shutdown()
            self._imds.server_close()
        self._guard("stop", self._remove_all)
        if self._added_address:
            self._guard("stop", lambda: _ip("addr", "del", f"{IMDS_ADDRESS}/32", "dev", "lo"))
        self._lockfile.close()  # releases the flock
        self._lockfile = None

    def __enter__(self) -> Hypervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests ask -----------------------------------------------------------------------
    def address(self, instance_id: str) -> str | None:
        """The public IP the instance's container answers at, once it has one."""
        with self._lock:
            vm = self._vms.get(instance_id)
        return vm.address if vm else None

    def container(self, instance_id: str) -> str | None:
        with self._lock:
            vm = self._vms.get(instance_id)
        return vm.container if vm else None

    def rebalance(self, instance_id: str) -> None:
        """Post an EC2 rebalance recommendation: IMDS answers 200 with its noticeTime from now on."""
        with self._lock:
            self._rebalances[instance_id] = _utc(time.time())

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping.wait(self.every_s):
            self._guard("tick", self._tick)

    def _tick(self) -> None:
        containers = self._containers()  # if Docker does not answer, skip the tick rather than take every VM for off
        for region in self.regions:
            self._guard(f"instances in {region}", partial(self._sync_instances, region, containers))
            self._guard(f"experiments in {region}", partial(self._sync_experiments, region))
        self._guard("interruptions", self._interrupt_due)
        if self.guests is not None:
            self._guard("gce", partial(self.guests.tick, containers, _demux))

    def _guard(self, subject: str, step: Callable[[], object]) -> None:
        """Run one step; a failure is logged (once per distinct message) and kept in ``errors``, never fatal."""
        try:
            step()
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if self.errors.get(subject) != message:
                log.warning("aws hypervisor: %s: %s", subject, message, exc_info=True)
            self.errors[subject] = message

    def _containers(self) -> dict[str, dict[str, Any]]:
        return {c["Labels"][INSTANCE_LABEL]: c for c in self.engine.containers({HV_LABEL: "1"}) if INSTANCE_LABEL in c["Labels"]}

    def _sync_instances(self, region: str, containers: dict[str, dict[str, Any]]) -> None:
        pages = self._clients["ec2", region].get_paginator("describe_instances").paginate()
        instances = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        listed = {i["InstanceId"] for i in instances}
        with self._lock:  # instances moto forgot (AwsCloud.reset()) are as good as terminated
            gone = [{"InstanceId": i, "State": {"Name": "terminated"}} for i, vm in self._vms.items() if vm.region == region]
        gone = [g for g in gone if g["InstanceId"] not in listed]
        for inst in [*gone, *sorted(instances, key=lambda i: i["State"]["Name"] in RUNNING)]:  # stops first: they free addresses
            found = containers.get(inst["InstanceId"])
            self._guard(inst["InstanceId"], partial(self._step, region, inst, found))

    def _step(self, region: str, inst: dict[str, Any], container: dict[str, Any] | None) -> None:
        """Bring one instance's container in line with moto's state of it."""
        iid, state, address = inst["InstanceId"], inst["State"]["Name"], inst.get("PublicIpAddress")
        with self._lock:
            vm = self._vms.get(iid)
        if state not in RUNNING:
            ident = container["Id"] if container is not None else vm.container if vm is not None else None
            if ident is not None:
                log.info("aws hypervisor: %s is %s; removing its container", iid, state)
                self.engine.remove(ident)
                with self._lock:
                    self._vms.pop(iid, None)
        elif vm is None:
            self._boot(region, inst)
        elif container is None or container["State"] not in ("created", "running"):
            code, output = _tail(self.engine, vm.container)
            log.log(
                logging.INFO if code == 0 else logging.WARNING, "aws hypervisor: %s powered off (exit %s%s)", iid, code, output
            )
            self._keep_console(region, iid, vm.container)
            self._clients["ec2", region].terminate_instances(InstanceIds=[iid])
        elif address and address != vm.address:
            log.info("aws hypervisor: %s moves from %s to %s", iid, vm.address, address)
            self.engine.disconnect(NETWORK, vm.container)
            self.engine.connect(NETWORK, vm.container, address)
            with self._lock:
                vm.address = address

    def _keep_console(self, region: str, iid: str, container: str) -> None:
        """EC2 keeps a terminated VM's serial console: GetConsoleOutput for ``iid`` answers it (moto's is a constant)."""
        answer = getattr(self.cloud, "answer", None)
        if answer is None:
            return
        raw = self.engine.http.get(f"/containers/{container}/logs", params={"stdout": 1, "stderr": 1}).content
        text = _demux(raw)[-CONSOLE_BYTES:]
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<GetConsoleOutputResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>hv-{iid}</requestId><instanceId>{iid}</instanceId><timestamp>{_utc(time.time())}</timestamp>"
            f"<output>{base64.b64encode(text).decode()}</output></GetConsoleOutputResponse>"
        )
        answer("GetConsoleOutput", xml, region=region, match={"InstanceId": iid})

    def _boot(self, region: str, inst: dict[str, Any]) -> None:
        """A container at the instance's public IP that runs its user data, presses in the power button, then sshd."""
        iid, address = inst["InstanceId"], inst.get("PublicIpAddress")
        if not address or ipaddress.ip_address(address) not in INTERNET:
            raise ValueError(f"public address {address} is not on {INTERNET} (is moto's address pool patched?)")
        attribute = self._clients["ec2", region].describe_instance_attribute(InstanceId=iid, Attribute="userData")
        script = base64.b64decode(attribute.get("UserData", {}).get("Value", ""))
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        name = f"ddctl-hv-{iid}"
        self.engine.remove(name)
        assert self.image is not None, "start() first"
        labels = {
            HV_LABEL: "1",
            INSTANCE_LABEL: iid,
            RUN_LABEL: tags.get("ddctl-run", ""),
            NAME_LABEL: tags.get("ddctl-name", ""),
        }
        endpoint = {"IPAMConfig": {"IPv4Address": address}}
        ident = self.engine.create_container(
            name,
            {
                "Image": self.image.ref,
                "Cmd": ["/bin/sh", "-c", BOOT],
                "Hostname": iid,
                "Labels": labels,
                "HostConfig": {"Binds": list(self.image.binds), "NetworkMode": NETWORK},
                "NetworkingConfig": {"EndpointsConfig": {NETWORK: endpoint}},
            },
        )
        try:
            self.engine.put_archive(ident, tar_of({USER_DATA: (script, 0o700)}))
            self.engine.start(ident)
            self.shape(region, ident)
        except BaseException:
            self.engine.remove(ident)
            raise
        with self._lock:
            self._vms[iid] = Vm(ident, region, address)
        log.info("aws hypervisor: %s boots at %s", iid, address)

    def shape(self, region: str, container: str) -> None:
        """Shape a booted VM's link as its cloud region's WAN link (when ``links`` names the region)."""
        if region in self.links:
            pid = int((self.engine.inspect(container) or {})["State"]["Pid"])
            linkshape.shape_netns_of(pid, *self.links[region])
            self.shaped[container] = self.links[region]

    # -- spot interruptions -------------------------------------------------------------------
    def _sync_experiments(self, region: str) -> None:
        """Carry out each new FIS experiment: notices now, the kill when their duration runs out."""
        fis = self._clients["fis", region]
        for summary in (e for page in fis.get_paginator("list_experiments").paginate() for e in page["experiments"]):
            if summary["id"] not in self._experiments:
                for iid, seconds in interruptions(fis.get_experiment(id=summary["id"])["experiment"]):
                    log.info("aws hypervisor: FIS %s interrupts %s in %gs", summary["id"], iid, seconds)
                    self.notices.post(iid, seconds)
                    self._deadlines[iid] = (time.monotonic() + seconds, region)
                self._experiments.add(summary["id"])

    def _interrupt_due(self) -> None:
        for iid, (at, region) in list(self._deadlines.items()):
            if time.monotonic() >= at:
                del self._deadlines[iid]
                ident = self.container(iid)
                log.info("aws hypervisor: the interruption of %s is due", iid)
                if ident is not None:
                    self.engine.kill(ident)
                with contextlib.suppress(self._clients["ec2", region].exceptions.ClientError):  # gone from moto already
                    self._clients["ec2", region].terminate_instances(InstanceIds=[iid])

    # -- IMDS ---------------------------------------------------------------------------------
    def _instance_at(self, address: str) -> str | None:
        with self._lock:
            return next((iid for iid, vm in self._vms.items() if vm.address == address), None)

    def _rebalance_at(self, address: str) -> str | None:
        iid = self._instance_at(address)
        with self._lock:
            return None if iid is None else self._rebalances.get(iid)

    def _serve_imds(self) -> None:
        """169.254.169.254 on lo, port 80: containers reach it through their gateway (the host), which owns it."""
        if f"inet {IMDS_ADDRESS}/" not in _ip("-4", "addr", "show", "dev", "lo"):
            _ip("addr", "add", f"{IMDS_ADDRESS}/32", "dev", "lo")
        self._added_address = True  # ours either way: the lock makes this the only hypervisor, so one found is a leftover
        self._imds = ThreadingHTTPServer((IMDS_ADDRESS, 80), metadata_handler(self.notices, self._rebalance_at, self.guests))
        threading.Thread(target=self._imds.serve_forever, name="aws-hypervisor-imds", daemon=True).start()

    # -- plumbing -----------------------------------------------------------------------------
    def _remove_all(self) -> None:
        for c in self.engine.containers({HV_LABEL: "1"}):
            self.engine.remove(c["Id"])
        for n in self.engine.networks({HV_LABEL: "1"}):
            self.engine.remove_network(n["Id"])
        with self._lock:
            self._vms.clear()


def _try_lock(lockfile: Any) -> bool:
    try:
        fcntl.flock(lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def _demux(raw: bytes) -> bytes:
    """The Engine API's multiplexed log stream (8-byte frame headers) as plain bytes."""
    out, at = bytearray(), 0
    while at + 8 <= len(raw):
        size = int.from_bytes(raw[at + 4 : at + 8], "big")
        out += raw[at + 8 : at + 8 + size]
        at += 8 + size
    return bytes(out)


def _tail(engine: Engine, container: str, lines: int = 5) -> tuple[int | None, str]:
    """Exit code and last output of a stopped container (a failing user data script shows here), for the log."""
    info = engine.inspect(container)
    if info is None:
        return None, ", its container is gone"
    raw = engine.http.get(f"/containers/{container}/logs", params={"stdout": 1, "stderr": 1, "tail": lines}).content
    text = _demux(raw).decode(errors="replace").strip()
    return int(info["State"]["ExitCode"]), f": {text[-500:]}" if text else ""


__all__ = ["Hypervisor"]
