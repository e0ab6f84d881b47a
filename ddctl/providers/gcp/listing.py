"""Reading instances back from Compute Engine: every refusal classified, every instance checked in shape before use.

``ddctl down``, ``ddctl ls``, ``down --orphans`` and the controller act on what
these reads answer. A refused read (403, 401, 429, 5xx, a network failure, a
retry that ran out) is a ``ProvisionError`` saying what was read, where and in
which project, as a refused insert is, never the library's exception (which
the CLI would end in a traceback); only ``get``'s 404 is an answer (the VM is
gone). The library fills what GCE leaves out with defaults (``""``, ``[]``),
so an instance is kept only with a name and a zone of GCE's own patterns: they
become its provider id, the next call's URL and log lines. A listed instance
without its zone URL takes the zone from the aggregated list's key
(``zones/ZONE``), so ``down`` still finds it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ddctl.errors import ProvisionError
from ddctl.providers.base import RUN_LABEL
from ddctl.providers.gcp.clients import Clients
from ddctl.providers.gcp.errors import classify, http_status
from ddctl.providers.gcp.machines import items, label, region_of, zone_of

NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
"""GCE's resource names (an instance's)."""
ZONE = re.compile(r"[a-z]+(-[a-z0-9]+)+-[a-z]")
"""A zone: ``us-central1-a``, ``northamerica-northeast1-b``."""

_log = logging.getLogger(__name__)


def refused(clients: Clients, error: Exception, doing: str, *, project: str, zone: str = "") -> ProvisionError:
    """``error`` of a read as the provider's ProvisionError, naming what was read (``doing``), the zone and the project."""
    region = region_of(zone) if zone else ""
    where = f"{doing} in project {project}"
    return classify(error, region=region, zone=zone, credentials=clients.described, doing=where)


def get(clients: Clients, project: str, zone: str, name: str) -> Any | None:
    """The instance as GCE describes it now; None once it is gone (404)."""
    try:
        return clients.client("InstancesClient").get(project=project, zone=zone, instance=name, **clients.read)
    except Exception as exc:
        if http_status(exc) == 404:
            return None
        raise refused(clients, exc, f"reading instance {name}", project=project, zone=zone) from None


def aggregated(clients: Clients, project: str, query: str, doing: str) -> list[Any]:
    """Every instance of ``project`` that ``query`` (a label filter) finds in any zone, every page read, those of
    another shape skipped (logged)."""
    from google.cloud import compute_v1

    request = compute_v1.AggregatedListInstancesRequest(project=project, filter=query)
    try:  # the pager reads its next pages while iterated: those reads are refused here too
        pages = clients.client("InstancesClient").aggregated_list(request=request, **clients.read)
        found = [(str(key), raw) for key, scoped in pages for raw in scoped.instances]
    except Exception as exc:
        raise refused(clients, exc, doing, project=project) from None
    return [raw for key, raw in found if shaped(raw, key)]


def shaped(raw: Any, key: str = "") -> bool:
    """``raw`` has a name and a zone of GCE's patterns (a zone left out is read from the aggregated ``key``)."""
    if not str(raw.zone) and ZONE.fullmatch(key.removeprefix("zones/")):
        raw.zone = key  # zone_of reads the last part of it, as of GCE's zone URL
    ok = NAME.fullmatch(str(raw.name)) is not None and ZONE.fullmatch(zone_of(raw)) is not None
    if not ok:
        _log.warning("GCE listed an instance of another shape: skipped (name %.80r, zone %.120r)", str(raw.name), str(raw.zone))
    return ok


def of_run(clients: Clients, project: str, run: str) -> list[Any]:
    """Every instance of ``run`` (found by label, kept when its metadata names the run exactly)."""
    found = aggregated(clients, project, f'labels.{RUN_LABEL} = "{label(run)}"', f"listing the instances of run {run}")
    return [raw for raw in found if items(raw).get(RUN_LABEL) == run]
