"""``ddctl down --orphans``: what carries ``ddctl-run`` but belongs to no live run, or has outlived its expiry.

A laptop that lost its state, a controller killed mid-replace, a run from
another machine: what it left still carries the run's tags. An instance is an
orphan when its run is not live or its ``ddctl-expires-at`` has passed; a run
is live when this machine says so or its syncer VM runs, wherever it was
started. A run's network (security group, Elastic IP, key pair) is removed once
none of its instances is left. Only resources tagged ``ddctl-run`` are looked
at, so nothing ddctl did not make is ever touched.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ddctl.providers.aws import network
from ddctl.providers.aws.answers import records
from ddctl.providers.aws.machines import EXPIRES_TAG, instances_of, tag_map
from ddctl.providers.base import RUN_LABEL

TAGGED = [{"Name": "tag-key", "Values": [RUN_LABEL]}]


def expired(tags: dict[str, str], now: float) -> bool:
    """True when the tag's time has passed (an unreadable one is not taken as expired: never guess to delete)."""
    raw = tags.get(EXPIRES_TAG, "")
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp() < now
    except ValueError:
        return False


def orphaned(instances: list[dict[str, Any]], live: set[str], now: float) -> list[dict[str, Any]]:
    """The instances (not yet terminated) whose run is not live or whose expiry passed."""
    return [
        raw
        for raw in instances
        if raw["State"]["Name"] != "terminated" and (tag_map(raw).get(RUN_LABEL) not in live or expired(tag_map(raw), now))
    ]


def training(ec2: Any) -> set[str]:
    """The runs with a syncer VM up in ``ec2``'s region: alive, whichever machine started them."""
    filters = [
        *TAGGED,
        {"Name": "tag:ddctl-role", "Values": ["syncer"]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return {tag_map(i).get(RUN_LABEL, "") for i in instances_of(pages)} - {""}


def sweep(ec2: Any, live: set[str], now: float, terminate: Any) -> list[tuple[str, str]]:
    """Terminate ``ec2``'s region's orphan instances (with ``terminate(ids)``, which waits), then dead runs' networks."""
    instances = instances_of(ec2.get_paginator("describe_instances").paginate(Filters=TAGGED))
    doomed = orphaned(instances, live, now)
    removed = [("instance", f"{ec2.meta.region_name}/{tag_map(raw).get(RUN_LABEL)}/{raw['InstanceId']}") for raw in doomed]
    if doomed:
        terminate([raw["InstanceId"] for raw in doomed])
    running = {tag_map(raw).get(RUN_LABEL) for raw in instances if raw not in doomed and raw["State"]["Name"] != "terminated"}
    groups = records(ec2.describe_security_groups(Filters=TAGGED), "SecurityGroups", "DescribeSecurityGroups")
    addresses = records(ec2.describe_addresses(Filters=TAGGED), "Addresses", "DescribeAddresses")
    runs = {tag_map(g).get(RUN_LABEL, "") for g in [*groups, *addresses]} - {""}
    for run in sorted(runs - live - running):
        removed += network.remove_network(ec2, run)
    return removed
