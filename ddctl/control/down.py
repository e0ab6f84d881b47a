"""``ddctl down``: everything labelled with the run stops and is removed, the state file only a cache.

It is ``reconcile`` with nothing desired, carried out in an order that lets
learners push and leave: the controller first (it would replace what we stop),
learners before the syncer they push to, helpers last. Every local provider is
searched (the state file may be gone), and ``down`` is safe to repeat.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ddctl import providers
from ddctl.config.regions import RegionsFile
from ddctl.control.reconcile import Observed, reconcile
from ddctl.control.state import State
from ddctl.errors import DdctlError
from ddctl.providers.base import Instance, Provider

STOP_ORDER = {"controller": 0, "learner": 1, "syncer": 2, "metadata": 3}
"""The controller first (it would replace what we stop), learners before the syncer they push to, helpers last."""


def searched(state: State, run: str) -> list[Provider]:
    """The providers a run may have instances on: those its record names, and every local one that answers here."""
    record = state.run(run)
    kinds = set((record.detail.get("kinds") or {}).values()) if record is not None else set()
    kinds |= {k for k in providers.LOCAL_KINDS if providers.unavailable(k) is None}
    return [providers.get(k) for k in sorted(kinds)]


def down(
    run: str, state: State, grace_s: float = 15.0, spare: tuple[str, ...] = (), owners: list[Provider] | None = None
) -> dict[str, Any]:
    """Stop every instance labelled with ``run`` (but ``spare``), in ``STOP_ORDER``, and what they leave; idempotent.

    ``owners``: the providers to search (default: ``searched``). Returns what was
    removed, by kind: ``{"learner": [...], "syncer": [...], "network": [...], ...}``."""
    owners = searched(state, run) if owners is None else owners
    found: list[tuple[Provider, Instance]] = [(p, i) for p in owners for i in p.list_run(run) if i.name not in spare]
    actions = reconcile([], [Observed(name=i.name, alive=i.alive) for _, i in found], now=0.0)
    doomed = {a.name for a in actions if a.kind == "terminate"}
    roles = {r.name: r.role for r in state.instances(run)}

    def role(item: tuple[Provider, Instance]) -> str:
        name = item[1].name
        return roles.get(name, name if name in STOP_ORDER else "learner")

    chosen = [item for item in found if item[1].name in doomed]
    for stage in sorted({STOP_ORDER[role(item)] for item in chosen}):
        batch = [item for item in chosen if STOP_ORDER[role(item)] == stage]
        with ThreadPoolExecutor(max_workers=8) as pool:  # learners leave in parallel
            list(pool.map(lambda item: item[0].terminate(item[1], grace_s), batch))
    removed: dict[str, list[str]] = {}
    for item in chosen:
        removed.setdefault(KINDS.get(role(item), role(item)), []).append(item[1].name)
    for kind, name in (entry for p in owners for entry in p.cleanup(run)):
        removed.setdefault(kind, []).append(name)
    left = [i.name for p in owners for i in p.list_run(run) if i.name not in spare]
    if left:
        raise DdctlError(f"{len(left)} instances of {run} survived termination: {left}")
    if (record := state.run(run)) is not None:
        if "released_at" not in record.detail:  # when its machines went: the bill stops there (``runs.dollars_so_far``)
            state.update_run_detail(run, {"released_at": time.time()})
        state.set_run_state(run, "down")
    return {"run": run, "removed": {kind: sorted(names) for kind, names in sorted(removed.items())}}


def sweep_orphans(rf: RegionsFile, state: State, now: float) -> dict[str, Any]:
    """``down --orphans``: every region of ``rf`` swept for what runs no longer live (or past expiry) left behind."""
    from ddctl.control.runs import LIVE

    live = {r.id for r in state.runs() if r.state in LIVE}
    removed: dict[str, list[str]] = {}
    for kind in sorted({r.provider for r in rf.regions}):
        providers.require_built([kind])
        for what, name in providers.get(kind).sweep([r for r in rf.regions if r.provider == kind], live, now):
            removed.setdefault(what, []).append(name)
    return {"run": "orphans", "removed": {kind: sorted(names) for kind, names in sorted(removed.items())}}


def report(result: dict[str, Any]) -> str:
    """``down``'s one line: exactly what was removed, by kind, or that there was nothing to remove."""
    parts = []
    for kind, names in result["removed"].items():
        label = kind if len(names) == 1 else PLURALS.get(kind, f"{kind}s")
        parts.append(f"{len(names)} {label} ({', '.join(names)})")
    return f"{result['run']}: removed " + "; ".join(parts) if parts else f"{result['run']}: nothing to remove"


KINDS = {"metadata": "metadata endpoint"}
"""What a helper instance is, in ``down``'s report."""
PLURALS = {"metadata endpoint": "metadata endpoints", "network namespace": "network namespaces"}
