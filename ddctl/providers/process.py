"""The ``process`` provider: every instance is a local process group, labelled on its command line.

The label (``--label ddctl-run=RUN --label ddctl-name=NAME``) is what ``list_run``
finds by scanning ``/proc``, so a run is found and removed even when the local
state file is gone. A region with a link profile runs in a network namespace
whose veth pair is shaped with tc (``bootstrap``); its learners reach the syncer
at the host end. There is no machine to SSH into: ``create`` runs the agent
itself. Preemption is SIGTERM (the agent pushes its pending drift and leaves)
followed by SIGKILL once the notice runs out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers import console, deploy, linkshape
from ddctl.providers.base import LOOPBACK, NAME_LABEL, RUN_LABEL, Instance, InstanceSpec, PreemptionNotice, RegionInfo
from ddctl_agents.waiting import wait_until

if TYPE_CHECKING:
    from ddctl.config.regions import Region


LAUNCHERS = (["setsid"], ["ip"])
"""Programs that exec the agent in its place (``setsid -f``, a shaped region's ``ip netns exec``)."""


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _labels(argv: list[str]) -> dict[str, str]:
    labels = {}
    for i, arg in enumerate(argv[:-1]):
        if arg == "--label" and "=" in argv[i + 1]:
            key, _, value = argv[i + 1].partition("=")
            labels[key] = value
    return labels


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; it only waits to be reaped


class ProcessProvider:
    kind = "process"
    power_off = ""  # the process is the machine: when the agent ends, so does it

    def bootstrap(
        self, run: str, regions: list[Region], syncer_region: str = "", syncer_host: str = "", shard_regions: tuple[str, ...] = ()
    ) -> dict[str, RegionInfo]:
        """A shaped namespace per region with a link profile (when this machine can shape links).

        ``syncer_host``: the syncer runs in another provider's region (a cloud's), reached at that address."""
        shaping = linkshape.available() is None
        links = {
            r.name: linkshape.ensure_link(namespace(run, r.name), r.link.up_mbps, r.link.down_mbps)
            for r in regions
            if r.link is not None and shaping
        }
        bind = "0.0.0.0" if links else "127.0.0.1"  # a namespace reaches the syncer at its veth's host end
        return {
            r.name: RegionInfo(
                region=r.name,
                provider=self.kind,
                python=sys.executable,
                remote=False,
                syncer_host=syncer_host or (links[r.name].host_ip if r.name in links else "127.0.0.1"),
                syncer_bind=bind,
                command_prefix=tuple(links[r.name].command()) if r.name in links else (),
                shaped=(r.link.up_mbps, r.link.down_mbps) if r.name in links and r.link else None,
            )
            for r in regions
        }

    def create(self, spec: InstanceSpec) -> Instance:
        """Start the agent detached (``setsid -f``: its own session, re-parented to init, outliving ddctl)."""
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        argv = [*spec.argv, "--label", spec.label, "--label", f"{NAME_LABEL}={spec.name}"]
        with spec.log.open("ab") as log:
            launcher = subprocess.run(
                ["setsid", "-f", *argv], stdout=log, stderr=log, stdin=subprocess.DEVNULL, env={**os.environ, **spec.env}
            )
        if launcher.returncode != 0:
            raise DdctlError(f"could not start {spec.name}: setsid exited {launcher.returncode}; see {spec.log}")

        def started() -> Instance | None:
            """Listed, and past its execs: ``setsid``'s own process (or its child before the exec), and ``ip netns
            exec`` of a shaped region's prefix, carry the same labels, and a listing taken while one execs can miss
            it (a CI run's contract test did, twice: once behind setsid, once behind ip)."""
            found = next((i for i in self.list_run(spec.run) if i.name == spec.name), None)
            return found if found is not None and _cmdline(int(found.provider_id))[:1] not in LAUNCHERS else None

        return wait_until(
            started,
            timeout_s=10,
            every_s=0.02,
            what=f"{spec.name} to come up",
            error=lambda m: DdctlError(f"{m}; see {spec.log}"),
        )

    def list_run(self, run: str) -> list[Instance]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            labels = _labels(_cmdline(int(entry.name)))
            if labels.get(RUN_LABEL) == run and _alive(int(entry.name)):
                found.append(
                    Instance(
                        name=labels.get(NAME_LABEL, "?"), provider_id=entry.name, run=run, alive=True, private_address=LOOPBACK
                    )
                )
        return sorted(found, key=lambda i: i.name)

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None:
        pid = int(instance.provider_id)
        if _labels(_cmdline(pid)).get(RUN_LABEL) != instance.run:
            return  # gone already, or the pid now belongs to someone else: never kill a stranger
        _signal_group(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not _alive(pid), timeout_s=grace_s, every_s=0.05, what=f"{instance.name} to exit")
        except TimeoutError:
            _signal_group(pid, signal.SIGKILL)

    def preempt(self, instance: Instance, notice_s: float) -> None:
        """The notice is SIGTERM (the agent pushes its drift and leaves); SIGKILL when it runs out."""
        self.terminate(instance, grace_s=notice_s)

    def notices(self, run: str) -> list[PreemptionNotice]:
        return []  # the notice is the signal itself: nothing is outstanding between notice and exit

    def ssh_target(self, instance: Instance) -> None:
        return None  # a local process: there is no machine to log into

    def read_file(self, instance: Instance, path: str, limit: int | None = None) -> bytes | None:
        most = console.limit_of(path, limit)
        try:
            with Path(path).open("rb") as f:  # a local process sees this machine's files
                return deploy.within(f.read(most + 1), "localhost", path, most)
        except OSError:
            return None

    def retire(self, instance: Instance, log: Path) -> None:
        return None  # the process wrote its log here already, and an ended process leaves nothing behind

    def cleanup(self, run: str) -> list[tuple[str, str]]:
        """The run's shaped network namespaces."""
        if linkshape.available() is not None:
            return []
        removed = linkshape.namespaces(namespace(run, ""))
        for name in removed:
            linkshape.destroy_link(name)
        return [("network namespace", name) for name in removed]

    def sweep(self, regions: list[Region], live: set[str], now: float) -> list[tuple[str, str]]:
        """Nothing to sweep: this machine's runs are found by ``ddctl down --run`` and ``ddctl gc``."""
        return []

    def admit(self, run: str, learners: Mapping[str, str]) -> None:
        """Nothing to open: this machine's regions reach the syncer without firewall rules."""

    def cut_link(self, run: str, region: str) -> None:
        raise self._no_partition(region)

    def heal_link(self, run: str, region: str) -> None:
        raise self._no_partition(region)

    def classify(self, error: Exception) -> ProvisionError:
        """Local processes have no capacity or quota: an error starting one is this machine's (transient)."""
        if isinstance(error, ProvisionError):
            return error
        return ProvisionError(str(error), kind="transient", scope="zone", code=type(error).__name__, provider=self.kind)

    def _no_partition(self, region: str) -> DdctlError:
        return DdctlError(
            f"region {region} runs as local processes, which share this machine's network: it cannot be cut off "
            "(partitions need Docker regions)"
        )


def namespace(run: str, region: str) -> str:
    """The network namespace of a run's region (its name is how ``cleanup`` finds it)."""
    return f"ddctl-{run}-{region}"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
