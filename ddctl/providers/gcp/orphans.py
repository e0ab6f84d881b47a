"""``ddctl down --orphans`` on GCE: instances labelled ``ddctl-run`` whose run is not live or whose time is up.

An instance is an orphan when its run is not live or its ``ddctl-expires-at``
label has passed; a run is live when this machine says so or its syncer VM
runs. Firewall rules and reserved addresses named for a dead run (``ddctl-RUN-*``)
go once none of its instances is left. Only what carries ddctl's label or
name is looked at, so nothing ddctl did not make is touched.
"""

from __future__ import annotations

from typing import Any

from ddctl.providers.base import RUN_LABEL
from ddctl.providers.gcp import listing, network
from ddctl.providers.gcp.clients import CALL_TIMEOUT_S, Clients
from ddctl.providers.gcp.errors import http_status
from ddctl.providers.gcp.machines import EXPIRES_LABEL, LIVE_STATES, ROLE_LABEL, items, label, region_of, zone_of


def expired(labels: dict[str, str], now: float) -> bool:
    """True when ``ddctl-expires-at`` has passed (an unreadable one is not: never guess to delete).

    ASCII digits only: a label value may be any lowercase Unicode, and ``"²".isdigit()`` is true where ``int`` fails."""
    value = labels.get(EXPIRES_LABEL, "")
    return value.isascii() and value.isdigit() and int(value) < now


def orphaned(instances: list[Any], live: set[str], now: float) -> list[Any]:
    """The instances whose run (exact, from the metadata) is not live, or whose expiry passed."""
    return [raw for raw in instances if items(raw).get(RUN_LABEL) not in live or expired(dict(raw.labels), now)]


def training(instances: list[Any]) -> set[str]:
    """The runs with a syncer VM up: alive, whichever machine started them."""
    return {
        items(raw).get(RUN_LABEL, "")
        for raw in instances
        if dict(raw.labels).get(ROLE_LABEL) == "syncer" and str(raw.status) in LIVE_STATES
    } - {""}


def sweep(clients: Clients, project: str, regions: list[str], live: set[str], now: float) -> list[tuple[str, str]]:
    """Delete ``project``'s orphan instances in ``regions``, then the firewalls and addresses of runs left with none."""
    found = listing.aggregated(clients, project, f"labels.{RUN_LABEL}:*", "listing ddctl's instances")
    tagged = [raw for raw in found if RUN_LABEL in dict(raw.labels)]
    here = [raw for raw in tagged if region_of(zone_of(raw)) in regions]
    doomed = orphaned(here, live | training(tagged), now)
    spared = {label(run) for run in live} | {label(items(raw).get(RUN_LABEL, "")) for raw in tagged if raw not in doomed}
    removed = []
    for raw in doomed:
        try:
            op = clients.client("InstancesClient").delete_unary(
                project=project, zone=zone_of(raw), instance=raw.name, timeout=CALL_TIMEOUT_S
            )
            clients.wait(op, project, zone=zone_of(raw))
        except Exception as exc:
            if http_status(exc) != 404:  # gone since the listing (a SPOT VM deletes itself when preempted): fine
                raise listing.refused(clients, exc, f"deleting orphan {raw.name}", project=project, zone=zone_of(raw)) from None
            continue
        removed.append(("instance", f"{zone_of(raw)}/{items(raw).get(RUN_LABEL)}/{raw.name}"))
    rules = clients.client("FirewallsClient").list(project=project, **clients.read)
    named = ((_run_of(str(rule.description)), str(rule.name)) for rule in rules)
    dead = sorted({run for run, name in named if run and run not in spared and name in network.rule_names(run)})
    for run in dead:  # each run once, after the listing: its rules go together
        removed += network.remove_network(clients, project, run, regions)
    return removed


def _run_of(description: str) -> str:
    """The run a rule was made for, from its description ``... (ddctl run RUN)``; "" if not ddctl's."""
    marker = "(ddctl run "
    return description.rsplit(marker, 1)[1].rstrip(")") if marker in description and description.endswith(")") else ""
