"""Every event the control plane records reads as a sentence in the event log, not as its fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddctl.dashboard.events import EVENT_FORMATS, said

ROOT = Path(__file__).resolve().parents[1]
RECORDED = re.compile(r'\.event\(\s*[^,()]+(?:\([^)]*\))?,\s*"([a-z_-]+)"')
"""``state.event(run, "kind", ...)``, the control plane's one way to record an event."""


def recorded_kinds() -> set[str]:
    return {kind for path in (ROOT / "ddctl").rglob("*.py") for kind in RECORDED.findall(path.read_text())}


def test_every_kind_the_control_plane_records_has_words() -> None:
    kinds = recorded_kinds()
    assert {"created", "replaced", "provision-failed", "terminate", "stop", "error"} <= kinds  # the scan finds them
    assert kinds - set(EVENT_FORMATS) == set()
    assert {"wait", "give_up"} <= set(EVENT_FORMATS)  # recorded under the action's kind (``Action.kind``)


@pytest.mark.parametrize(
    ("event", "words", "style"),
    [
        ({"event": "created", "instance": "L0", "region": "eu", "reason": "L0 is in the plan and not running"},
         "L0 (eu) created: L0 is in the plan and not running", ""),
        ({"event": "provision-failed", "instance": "L0", "error": "capacity", "code": "InsufficientInstanceCapacity",
          "reason": "at eu/eu-a: no capacity"}, "L0 could not start (capacity): at eu/eu-a: no capacity", "red"),
        ({"event": "terminate", "instance": "L0-n1", "region": "eu", "reason": "L0 lost L0-n0"},
         "L0-n1 (eu) terminated: L0 lost L0-n0", ""),
        ({"event": "stop", "reason": "L0 given up (see the event log); every other learner finished its share"},
         "the job is asked to stop: L0 given up (see the event log); every other learner finished its share", ""),
        ({"event": "give_up", "instance": "L0", "reason": "L0: its agent ended within 600s of its start 5 times"},
         "L0: its agent ended within 600s of its start 5 times", "red"),
        ({"event": "error", "instance": "L1", "region": "eu", "reason": "whether L1 finished is unknown, it waits"},
         "L1: whether L1 finished is unknown, it waits", "red"),
        ({"event": "error", "where": "controller", "message": "boom"}, "controller: boom", "red"),  # the other shape
        ({"event": "created", "instance": "L0"}, "instance=L0", ""),  # a field missing: its fields, no raise
    ],
)  # fmt: skip
def test_what_the_control_planes_events_say(event: dict[str, str], words: str, style: str) -> None:
    assert said({"t": 0.0, "source": "ddctl", **event}) == (words, style)
