"""An in-memory provider for tests and demos: instances that cost nothing, and faults on demand.

It keeps the contract of ``base.py`` to the letter (labels, alive, notices,
summaries) without running anything, and refuses ``create`` where a fault plan
says so, with the same ProvisionError a cloud's classifier would produce:
capacity in a zone, quota in a region, credentials for the whole cloud,
transient hiccups. The controller's failover is tested against it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddctl.errors import ProvisionError, ProvisionKind, ProvisionScope
from ddctl.providers import console, deploy
from ddctl.providers.base import Instance, InstanceSpec, PreemptionNotice, RegionInfo

if TYPE_CHECKING:
    from ddctl.config.regions import Region


@dataclass(slots=True)
class Fault:
    """Refuse ``times`` creates in ``cloud_region`` / ``zone`` ("*" matches any) with this error."""

    kind: ProvisionKind
    scope: ProvisionScope
    code: str
    cloud_region: str = "*"
    zone: str = "*"
    times: int = 1 << 30

    def matches(self, cloud_region: str, zone: str) -> bool:
        return self.times > 0 and self.cloud_region in ("*", cloud_region) and self.zone in ("*", zone)


@dataclass(slots=True)
class _Slot:
    spec: InstanceSpec
    ident: str
    alive: bool = True
    summary: bytes | None = None
    notice_s: float | None = None
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class FakeProvider:
    faults: list[Fault] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(verb, name) of every call, in order, for tests to read."""
    kind: str = "fake"
    power_off: str = ""
    _slots: dict[tuple[str, str], _Slot] = field(default_factory=dict)
    _regions: dict[str, dict[str, RegionInfo]] = field(default_factory=dict)
    _cut: set[tuple[str, str]] = field(default_factory=set)
    admitted: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per run, the learners (name -> address) the syncer's port was last opened to."""
    _serial: int = 0

    def bootstrap(
        self, run: str, regions: list[Region], syncer_region: str = "", syncer_host: str = "", shard_regions: tuple[str, ...] = ()
    ) -> dict[str, RegionInfo]:
        made = self._regions.setdefault(run, {})
        host = syncer_host or "127.0.0.1"
        for r in regions:
            made.setdefault(
                r.name, RegionInfo(region=r.name, provider=self.kind, python=sys.executable, remote=False, syncer_host=host)
            )
        self.calls.append(("bootstrap", ",".join(r.name for r in regions)))
        return {r.name: made[r.name] for r in regions}

    def create(self, spec: InstanceSpec) -> Instance:
        self.calls.append(("create", f"{spec.name}@{spec.cloud_region or spec.region}/{spec.zone or '-'}"))
        for fault in self.faults:
            if fault.matches(spec.cloud_region or spec.region, spec.zone):
                fault.times -= 1
                raise ProvisionError(
                    f"{fault.code} in {spec.cloud_region or spec.region}/{spec.zone or '*'}",
                    kind=fault.kind,
                    scope=fault.scope,
                    code=fault.code,
                    provider=self.kind,
                    region=spec.cloud_region or spec.region,
                    zone=spec.zone,
                )
        self._serial += 1
        slot = _Slot(spec=spec, ident=f"fake-{self._serial}")
        self._slots[(spec.run, spec.name)] = slot
        return self._instance(slot)

    def list_run(self, run: str) -> list[Instance]:
        return sorted((self._instance(s) for (r, _), s in self._slots.items() if r == run), key=lambda i: i.name)

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None:
        self.calls.append(("terminate", instance.name))
        self._slots.pop((instance.run, instance.name), None)

    def ssh_target(self, instance: Instance) -> None:
        return None

    def preempt(self, instance: Instance, notice_s: float) -> None:
        self.calls.append(("preempt", instance.name))
        slot = self._slots.get((instance.run, instance.name))
        if slot is not None:
            slot.alive, slot.notice_s = False, notice_s

    def notices(self, run: str) -> list[PreemptionNotice]:
        return [
            PreemptionNotice(instance=s.spec.name, seconds_left=s.notice_s)
            for (r, _), s in self._slots.items()
            if r == run and s.notice_s is not None
        ]

    def read_file(self, instance: Instance, path: str, limit: int | None = None) -> bytes | None:
        slot = self._slots.get((instance.run, instance.name))
        if slot is None:
            return None
        data = slot.summary if path == slot.spec.summary else slot.files.get(path)
        return None if data is None else deploy.within(data, "fake", path, console.limit_of(path, limit))

    def retire(self, instance: Instance, log: Path) -> None:
        self.calls.append(("retire", instance.name))
        self._slots.pop((instance.run, instance.name), None)

    def cleanup(self, run: str) -> list[tuple[str, str]]:
        return [("network", f"fake-network-{region}") for region in self._regions.pop(run, {})]

    def sweep(self, regions: list[Region], live: set[str], now: float) -> list[tuple[str, str]]:
        """Nothing to sweep: this machine's runs are found by ``ddctl down --run`` and ``ddctl gc``."""
        return []

    def admit(self, run: str, learners: Mapping[str, str]) -> None:
        self.admitted[run] = dict(learners)
        self.calls.append(("admit", ",".join(sorted(learners))))

    def cut_link(self, run: str, region: str) -> None:
        self._cut.add((run, region))

    def heal_link(self, run: str, region: str) -> None:
        self._cut.discard((run, region))

    def classify(self, error: Exception) -> ProvisionError:
        if isinstance(error, ProvisionError):
            return error
        return ProvisionError(str(error), kind="transient", scope="zone", code=type(error).__name__, provider=self.kind)

    # -- what tests do to instances -------------------------------------------------------------
    def write_summary(self, run: str, name: str, summary: bytes) -> None:
        """The agent of ``name`` writes its summary file while it still runs (the syncer, when its job is over)."""
        self._slots[(run, name)].summary = summary

    def write_file(self, run: str, name: str, path: str, data: bytes) -> None:
        """The agent of ``name`` writes a file on its machine (a syncer's tape)."""
        self._slots[(run, name)].files[path] = data

    def end(self, run: str, name: str, summary: bytes | None = None) -> None:
        """The agent of ``name`` ends (with an exit summary, if given): its instance is no longer alive."""
        slot = self._slots[(run, name)]
        slot.alive, slot.summary = False, summary

    def is_cut(self, run: str, region: str) -> bool:
        return (run, region) in self._cut

    def _instance(self, slot: _Slot) -> Instance:
        address = f"198.51.100.{int(slot.ident.rsplit('-', 1)[1]) % 250 + 1}"  # TEST-NET-2: each incarnation its own
        return Instance(
            name=slot.spec.name,
            provider_id=slot.ident,
            run=slot.spec.run,
            alive=slot.alive,
            zone=slot.spec.zone,
            address=address,
            private_address=f"10.0.0.{int(slot.ident.rsplit('-', 1)[1]) % 250 + 1}",
        )
