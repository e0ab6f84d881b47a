"""``ddctl status`` and ``ddctl status --watch``: gather a snapshot, draw it, and keep drawing it.

The syncer is asked from a background thread, so a slow or unreachable
syncer never freezes the screen: the screen keeps redrawing and shows how old
its last answer is. Ctrl-C only stops the drawing; the run is never touched.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from ddctl.control.rundir import RunDir
from ddctl.control.shard_status import MALFORMED, gather
from ddctl.control.state import State
from ddctl.control.up import admin_client
from ddctl.dashboard.checked import OTHER_SHAPE, OtherShape, checked_status, clean_status
from ddctl.dashboard.render import render
from ddctl.dashboard.sharded import job_status
from ddctl.dashboard.snapshot import RegionInfo, RunRecords, SyncerView, build
from ddctl.errors import DdctlError
from ddctl_agents.agent.client import Refused, Unavailable
from ddctl_agents.core.text import printable

EVENTS_READ = 200


def run_records(run: str, state: State) -> RunRecords:
    record = state.run(run)
    if record is None:
        raise DdctlError(f"no run {run!r} in {state.path}")
    return RunRecords(
        run=run,
        provider=",".join(sorted(set((record.detail.get("kinds") or {}).values()))) or str(record.detail.get("provider", "?")),
        instances=state.instances(run),
        events=state.events(run, EVENTS_READ),
        regions=region_info(record.regions_file),
        state=record.state,
        summary=record.detail.get("summary"),
        replanner=record.detail.get("replanner"),
    )


def region_info(path: str) -> dict[str, RegionInfo]:
    """Prices and zones from the run's regions file (empty if it has moved: the dashboard still works)."""
    from ddctl.config.regions import load_regions
    from ddctl.control.plan import price
    from ddctl.errors import RegionsError

    try:
        rf = load_regions(Path(path))
    except (RegionsError, OSError):
        return {}
    return {r.name: RegionInfo(r.provider, r.zones, price(r)) for r in rf.regions}


def ask_syncer(run: str, timeout_s: float = 3.0) -> SyncerView:
    """One status request; an unreachable syncer is an answer too (with the reason). A sharded synchronizer's shards
    are each asked, and their answers drawn as the job's (``dashboard/sharded.py``); one that does not answer is named."""
    if RunDir(run).shard_urls.is_file():
        return _ask_shards(run, timeout_s)
    try:
        client = admin_client(run, timeout_s=timeout_s)
    except OSError as exc:
        return SyncerView(None, None, f"no syncer address for {run}: {exc}")
    try:
        return SyncerView(checked_status(client.status()), time.time(), None, client.url)
    except (Unavailable, Refused, OtherShape) as exc:
        return SyncerView(None, None, printable(str(exc), 300), client.url, unusable=isinstance(exc, OtherShape))
    except RecursionError:  # JSON nested deeper than the parser goes
        return SyncerView(None, None, f"{OTHER_SHAPE}: nested too deep to read", client.url, unusable=True)
    finally:
        client.close()


def _ask_shards(run: str, timeout_s: float) -> SyncerView:
    urls = RunDir(run).urls()
    answers = gather(urls, lambda url: admin_client(run, timeout_s=timeout_s, url=url))
    missing = [f"{url}: {why}" for url, status, why in answers if status is None]
    error = f"{len(missing)} of {len(urls)} shards did not answer ({'; '.join(missing)})" if missing else None
    try:  # each shard's strings escaped before their figures are added up; the job's status checked as one's
        status = job_status([(url, None if s is None else clean_status(s), why) for url, s, why in answers])
        status = None if status is None else checked_status(status)
    except OtherShape as exc:
        return SyncerView(None, None, str(exc), urls[0], unusable=True)
    except MALFORMED as exc:  # shards' answers that do not add up together
        why = printable(f"a shard's status is malformed ({type(exc).__name__}: {exc}", 300)
        return SyncerView(None, None, why + ")", urls[0], unusable=True)
    return SyncerView(status, time.time() if status is not None else None, error and printable(error, 600), urls[0])


def snapshot(run: str, state: State) -> dict[str, Any]:
    """One static snapshot (``ddctl status``)."""
    return build(run_records(run, state), ask_syncer(run), time.time())


class SyncerPoller:
    """Asks the syncer every ``every_s`` on its own thread; keeps the last good answer and the latest error."""

    def __init__(self, run: str, every_s: float) -> None:
        self.run, self.every_s = run, every_s
        self.view = SyncerView(None, None, "waiting for the first answer")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="syncer-poll", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            answer = ask_syncer(self.run)
            if answer.status is not None:
                self.view = answer
            else:  # keep the last good status, say why the newest attempt failed
                self.view = SyncerView(self.view.status, self.view.fetched_at, answer.error, answer.url, answer.unusable)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()


def watch(run: str, state: State, console: Console, every_s: float = 1.0, frames: int = 0) -> None:
    """Redraw in place on a terminal (4 frames a second); elsewhere print a plain snapshot every ``every_s``.
    ``frames`` > 0 stops after that many frames (for tests); otherwise it runs until Ctrl-C."""
    poller = SyncerPoller(run, every_s)
    first = run_records(run, state)

    def records() -> RunRecords:  # the regions file is read once; instances and events every frame
        return replace(first, instances=state.instances(run), events=state.events(run, EVENTS_READ))

    drawn = 0
    try:
        if console.is_terminal:
            with Live(console=console, screen=True, auto_refresh=False, redirect_stderr=False) as live:
                while not frames or drawn < frames:
                    data = build(records(), poller.view, time.time())
                    live.update(render(data, console.width, console.height), refresh=True)
                    drawn += 1
                    time.sleep(0.25)
        else:
            while not frames or drawn < frames:
                time.sleep(every_s if drawn else min(every_s, 1.0))
                data = build(records(), poller.view, time.time())
                console.print(render(data, console.width, 10_000))
                console.print()
                drawn += 1
    except KeyboardInterrupt:
        pass
    finally:
        poller.stop()
