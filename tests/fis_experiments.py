"""What a FIS experiment asks of the test hypervisor: which instances get a spot-interruption notice, and how long
before each is stopped (``durationBeforeInterruption``, an ISO 8601 duration)."""

from __future__ import annotations

import re
from typing import Any

SPOT_INTERRUPTION = "aws:ec2:send-spot-instance-interruptions"


def parse_duration(text: str) -> float:
    """Seconds in an ISO 8601 duration such as FIS's ``PT2M`` or ``PT5S``."""
    found = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", text.strip())
    if found is None or text.strip() in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration: {text!r}")
    days, hours, minutes, seconds = (float(g or 0) for g in found.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def interruptions(experiment: dict[str, Any]) -> list[tuple[str, float]]:
    """(instance id, seconds of notice) for every spot-interruption action of a FIS experiment (``get_experiment``)."""
    found = []
    for action in (experiment.get("actions") or {}).values():
        if action.get("actionId") == SPOT_INTERRUPTION:
            seconds = parse_duration((action.get("parameters") or {}).get("durationBeforeInterruption", "PT2M"))
            for target in (action.get("targets") or {}).values():
                arns = (experiment.get("targets") or {}).get(target, {}).get("resourceArns") or []
                found += [(arn.rsplit("/", 1)[-1], seconds) for arn in arns]
    return found
