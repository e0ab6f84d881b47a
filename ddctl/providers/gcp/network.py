"""A run's network on GCE: three firewall rules on the VPC network, the syncer's reserved address, the project used.

Firewall rules are global and target network tags: ``ddctl-RUN-ssh`` opens SSH
to the operator's CIDR on every VM of the run; ``ddctl-RUN-internal`` opens
every TCP port of the run's VMs to the run's VMs (source tag = target tag,
which GCE matches on internal addresses only), so the nodes of a learner meet
(torchrun's c10d, NCCL, gloo) over the network's private addresses;
``ddctl-RUN-syncer`` opens the syncer's port on the syncer's VM (each shard's) to
the operator and to exactly the run's learners' addresses, wherever they run
(``admit`` rewrites its source ranges, so rules follow replacements). The
syncer's external address (each shard's: ``ddctl-RUN-syncer-s1``, ...) is
reserved before the syncer exists, so it goes into the
job's certificate and every learner's URL, and a replacement syncer comes back
at the same address. Everything is found by name, so each call is idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ddctl.control.rundir import RunDir
from ddctl.providers.base import answered_ipv4, syncer_name
from ddctl.providers.gcp.clients import CALL_TIMEOUT_S, Clients
from ddctl.providers.gcp.errors import http_status
from ddctl.providers.gcp.machines import label, resource_name, run_tag, syncer_tag


def ssh_rule(run: str) -> str:
    return resource_name(run, "ssh")


def syncer_rule(run: str) -> str:
    return resource_name(run, "syncer")


def internal_rule(run: str) -> str:
    return resource_name(run, "internal")


def rule_names(run: str) -> tuple[str, ...]:
    """Every firewall rule a run may have (cleanup and the orphan sweep delete these)."""
    return ssh_rule(run), syncer_rule(run), internal_rule(run)


def address_name(run: str, name: str = "syncer") -> str:
    """The reserved address of the synchronizer instance ``name`` (``syncer``, or a shard's ``syncer-s1``, ...)."""
    return resource_name(run, name)


def is_address_of(run: str, address: str) -> bool:
    """``address`` is the name of one of the run's reserved addresses (the syncer's, or a shard's)."""
    shard = address.removeprefix(address_name(run) + "-s")
    return address == address_name(run) or (shard.isdigit() and address == address_name(run, syncer_name(int(shard))))


def check_network(clients: Clients, project: str, network: str) -> None:
    """The VPC network exists (else GCE would refuse every insert with a less clear message)."""
    clients.client("NetworksClient").get(project=project, network=network, **clients.read)


def _firewall(
    name: str, run: str, network: str, target: str, why: str, *, ports: Iterable[str] = (), ranges: Iterable[str] = (),
    tags: Iterable[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """An INGRESS rule's body (GCE's JSON): tcp on ``ports`` (none: every port) to VMs tagged ``target``, from
    ``ranges`` (CIDRs) or VMs tagged ``tags``."""
    allowed: dict[str, Any] = {"IPProtocol": "tcp"} | ({"ports": list(ports)} if ports else {})
    body: dict[str, Any] = {
        "name": name,
        "network": f"global/networks/{network}",
        "direction": "INGRESS",
        "priority": 1000,
        "allowed": [allowed],
        "targetTags": [target],
        "description": f"{why} (ddctl run {label(run)})",
    }
    return body | ({"sourceRanges": sorted(set(ranges))} if ranges else {}) | ({"sourceTags": sorted(set(tags))} if tags else {})


def firewall_bodies(run: str, network: str, ssh_from: str, port: int, syncer: bool) -> list[dict[str, Any]]:
    """The run's rules: SSH from the operator, every TCP port between the run's VMs, and with ``syncer`` the syncer's
    port from the operator (its learners come with ``admit``)."""
    tag = run_tag(run)
    wanted = [
        _firewall(ssh_rule(run), run, network, tag, "SSH from the operator", ports=["22"], ranges=[ssh_from]),
        _firewall(internal_rule(run), run, network, tag, "any TCP port between the run's VMs", tags=[tag]),
    ]
    if syncer:
        why = "the syncer's port: the operator and the run's learners"
        wanted.append(_firewall(syncer_rule(run), run, network, syncer_tag(run), why, ports=[str(port)], ranges=[ssh_from]))
    return wanted


def ensure_firewalls(clients: Clients, project: str, run: str, network: str, ssh_from: str, port: int, syncer: bool) -> None:
    """The run's rules (``firewall_bodies``), each inserted unless a rule of its name is there."""
    from google.cloud import compute_v1

    firewalls = clients.client("FirewallsClient")
    for body in firewall_bodies(run, network, ssh_from, port, syncer):
        try:
            firewalls.get(project=project, firewall=body["name"], **clients.read)
            continue
        except Exception as exc:
            if not http_status(exc) == 404:
                raise
        try:
            op = firewalls.insert_unary(
                project=project, firewall_resource=compute_v1.Firewall.from_json(json.dumps(body)), timeout=CALL_TIMEOUT_S
            )
        except Exception as exc:
            if not http_status(exc) == 409:
                raise
            continue
        clients.wait(op, project)


def admitted(clients: Clients, project: str, run: str) -> set[str] | None:
    """The source ranges of the syncer's port, or None where the run's syncer is not on GCE."""
    try:
        rule = clients.client("FirewallsClient").get(project=project, firewall=syncer_rule(run), **clients.read)
    except Exception as exc:
        if http_status(exc) == 404:
            return None
        raise
    return {str(r) for r in rule.source_ranges}


def set_sources(clients: Clients, project: str, run: str, sources: Iterable[str]) -> None:
    """Rewrite the syncer rule's source ranges (patch: the rest of the rule stays)."""
    from google.cloud import compute_v1

    patch = compute_v1.Firewall(source_ranges=sorted(set(sources)))
    op = clients.client("FirewallsClient").patch_unary(
        project=project, firewall=syncer_rule(run), firewall_resource=patch, timeout=CALL_TIMEOUT_S
    )
    clients.wait(op, project)


def ensure_address(clients: Clients, project: str, region: str, run: str, syncer: str = "syncer") -> str:
    """The reserved external address in ``region`` of the synchronizer instance ``syncer`` (reserved on first use)."""
    from google.cloud import compute_v1

    addresses = clients.client("AddressesClient")
    name = address_name(run, syncer)
    what = f"GCE's reserved address {name}"
    try:
        return answered_ipv4(addresses.get(project=project, region=region, address=name, **clients.read).address, what)
    except Exception as exc:
        if not http_status(exc) == 404:
            raise
    body = compute_v1.Address(name=name, address_type="EXTERNAL", description=f"the syncer of ddctl run {label(run)}")
    op = addresses.insert_unary(project=project, region=region, address_resource=body, timeout=CALL_TIMEOUT_S)
    clients.wait(op, project, region=region)
    return answered_ipv4(addresses.get(project=project, region=region, address=name, **clients.read).address, what)


def remove_network(clients: Clients, project: str, run: str, regions: Iterable[str]) -> list[tuple[str, str]]:
    """Delete the run's firewall rules and release its reserved address (each gone already: fine)."""
    removed: list[tuple[str, str]] = []
    firewalls = clients.client("FirewallsClient")
    for name in rule_names(run):
        try:
            clients.wait(firewalls.delete_unary(project=project, firewall=name, timeout=CALL_TIMEOUT_S), project)
            removed.append(("firewall", f"{project}/{name}"))
        except Exception as exc:
            if not http_status(exc) == 404:
                raise
    addresses = clients.client("AddressesClient")
    for region in sorted(set(regions)):
        listed = addresses.list(project=project, region=region, **clients.read)
        for name in sorted(str(a.name) for a in listed if is_address_of(run, str(a.name))):  # the syncer's, each shard's
            try:
                op = addresses.delete_unary(project=project, region=region, address=name, timeout=CALL_TIMEOUT_S)
                clients.wait(op, project, region=region)
                removed.append(("address", f"{project}/{region}/{name}"))
            except Exception as exc:
                if not http_status(exc) == 404:
                    raise
    return removed


# -- where the run went --------------------------------------------------------------------------
def _footprint(run: str) -> Path:
    return RunDir(run).root / "gcp"


def remember(run: str, project: str, region: str) -> None:
    """The project and the cloud regions the run made something in (``down`` looks there)."""
    known = footprint(run)
    if known.get("project") not in (None, project):
        from ddctl.errors import DdctlError

        raise DdctlError(f"run {run} uses GCP project {known['project']!r}; one project per run (got {project!r})")
    regions = sorted({*known.get("regions", []), region})
    path = _footprint(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"project": project, "regions": regions}))


def footprint(run: str) -> dict[str, Any]:
    """``{"project": ..., "regions": [...]}`` of the run on GCE, or {} if it made nothing there."""
    try:
        raw = json.loads(_footprint(run).read_text())
    except (OSError, ValueError):
        return {}
    ok = (
        isinstance(raw, dict)
        and isinstance(raw.get("project"), str)
        and isinstance(raw.get("regions"), list)
        and all(isinstance(r, str) for r in raw["regions"])
    )
    return raw if ok else {}  # a file that is not ours (edited, torn): as if the run made nothing here


def project_of(run: str) -> str:
    """The project the run used on GCE ("" if none)."""
    return str(footprint(run).get("project", ""))


def forget(run: str) -> None:
    _footprint(run).unlink(missing_ok=True)
