"""``ddctl down``: everything labelled with the run stops and is removed, the state file only a cache.

It is ``reconcile`` with nothing desired, carried out in an order that lets
learners push and leave: the controller first (it would replace what we stop),
learners before the syncer they push to, helpers last. Every local provider is
searched (the state file may be gone), and ``down`` is safe to repeat.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ddctl import providers
from ddctl.control.reconcile import Observed, reconcile
from ddctl.control.state import State
from ddctl.errors import DdctlError
from ddctl.providers.base import Instance, Provider

STOP_ORDER = {"controller": 0, "learner": 1, "syncer": 2, "metadata": 3}
"""The controller first (it would replace what we stop), learners before the syncer they push to."""


def searched(state: State, run: str) -> list[Provider]:
    """The providers a run may have instances on: those its record names, and every local one that answers here."""
    record = state.run(run)
    kinds = set((record.detail.get("kinds") or {}).values()) if record is not None else set()
    kinds |= {k for k in providers.LOCAL_KINDS if providers.unavailable(k) is None}
    return [providers.get(k) for k in sorted(kinds)]


def down(run: str, state: State, grace_s: float = 15.0) -> dict[str, Any]:
    """Stop every instance labelled with ``run``, in ``STOP_ORDER``, and what they leave behind; idempotent."""
    owners = searched(state, run)
    found: list[tuple[Provider, Instance]] = [(p, i) for p in owners for i in p.list_run(run)]
    actions = reconcile([], [Observed(name=i.name, alive=i.alive) for _, i in found], now=0.0)
    doomed = {a.name for a in actions if a.kind == "terminate"}
    roles = {r.name: r.role for r in state.instances(run)}

    def rank(item: tuple[Provider, Instance]) -> int:
        name = item[1].name
        return STOP_ORDER.get(roles.get(name, name), STOP_ORDER["learner"])

    chosen = [item for item in found if item[1].name in doomed]
    for stage in sorted({rank(item) for item in chosen}):
        batch = [item for item in chosen if rank(item) == stage]
        with ThreadPoolExecutor(max_workers=8) as pool:  # learners leave in parallel
            list(pool.map(lambda item: item[0].terminate(item[1], grace_s), batch))
    removed = [name for p in owners for name in p.cleanup(run)]
    left = [i.name for p in owners for i in p.list_run(run)]
    if left:
        raise DdctlError(f"{len(left)} instances of {run} survived termination: {left}")
    if state.run(run) is not None:
        state.set_run_state(run, "down")
    return {"run": run, "stopped": [i.name for _, i in chosen], "removed": removed}
