"""One unit's life under interruptions: a whole data-parallel job, or one Decoupled learner.

A unit of ``chips`` chips in ``slices`` slices trains in synchronous steps.
Each interruption hits one chip (so one slice) and is announced ``notice_s``
before the chip goes down (maintenance and spot notices; 0 for a sudden
failure). The unit trains through the notice, then reconfigures once for every
interruption announced by then; interruptions announced while it reconfigures
are handled by the same reconfiguration. A non-elastic unit restarts on spare
slices (``restart_s``); an elastic one drops the interrupted slices
(``downscale_s``) and trains on the rest. A repaired slice waits up to
``upscale_wait_s`` to be added back by the next reconfiguration, else it gets
an upscale pause of its own (``upscale_s``); an elastic learner that lost every
slice also fetches the current fragments (``fetch_s``) before it trains again.
Every chip-second of the horizon is accounted exactly once: useful, or lost to
reconfiguring, repair (slices out) or stragglers.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ddctl.goodput.params import SimParams

LOSSES = ("reconfiguring", "repair", "straggler", "blocked")


@dataclass(slots=True)
class UnitRun:
    chips: int
    slices: int
    useful: float = 0.0
    """Chip-seconds of useful training."""
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOSSES, 0.0))
    seg_start: list[float] = field(default_factory=list)
    seg_end: list[float] = field(default_factory=list)
    seg_live: list[int] = field(default_factory=list)
    """Training segments [start, end) with ``live`` slices in; between them the unit is paused or idle."""
    seg_useful: list[float] = field(default_factory=list)
    """Useful chips in each segment (live chips, less stragglers)."""
    interruptions: int = 0


def straggler_factor(live: int, jitter: float) -> float:
    """Mean step time / expected slowest of ``live`` slices (normal step times with CV ``jitter``)."""
    return 1.0 if live < 2 or jitter == 0 else 1.0 / (1.0 + jitter * math.sqrt(2.0 * math.log(live)))


class _Unit:
    """The event loop's state; ``simulate_unit`` is the pure entry point."""

    def __init__(
        self, run: UnitRun, times: list[float], hit: list[int], repair: list[float], p: SimParams, elastic: bool, fetch_s: float
    ) -> None:
        self.run, self.times, self.hit, self.repair, self.p, self.elastic = run, times, hit, repair, p, elastic
        self.fetch_s = fetch_s
        self.out = [False] * run.slices
        self.live, self.next = run.slices, 0
        self.returns: list[tuple[float, int]] = []  # (repaired at, slice)
        self.paused = self.idle = 0.0

    def train(self, start: float, end: float) -> None:
        if end > start:
            self.run.seg_start.append(start)
            self.run.seg_end.append(end)
            self.run.seg_live.append(self.live)

    def skip_out(self) -> None:
        """Interruptions of chips in a slice that is out already cost nothing more: it is being repaired."""
        while self.elastic and self.next < len(self.times) and self.out[self.hit[self.next]]:
            self.next += 1

    def take(self, until: float) -> list[int]:
        """Interruptions announced by ``until`` (their slices go out at the next reconfiguration's end)."""
        taken = []
        while self.next < len(self.times) and self.times[self.next] <= until:
            taken.append(self.next)
            self.next += 1
        return taken

    def pause(self, start: float, length: float, taken: list[int]) -> float:
        """One reconfiguration: absorbs what is announced or repaired while it runs; returns its end."""
        end = min(start + length, self.p.horizon_s)
        taken += self.take(end)
        for k in taken:
            s = self.hit[k]
            if self.elastic and not self.out[s]:
                self.out[s] = True
                self.live -= 1
                heapq.heappush(self.returns, (self.times[k] + self.p.notice_s + self.repair[k], s))
        while self.returns and self.returns[0][0] <= end:
            s = heapq.heappop(self.returns)[1]
            if self.out[s]:
                self.out[s] = False
                self.live += 1
        self.paused += end - start
        return end

    def loop(self) -> None:
        p, t, horizon = self.p, 0.0, self.p.horizon_s
        while t < horizon:
            self.skip_out()
            repaired = self.returns[0][0] if self.returns else math.inf
            if self.live == 0:  # every slice is out: idle until one is repaired, then add it back
                resume = min(repaired, horizon)
                self.idle += resume - t
                t = resume if resume >= horizon else self.pause(resume, p.upscale_s + self.fetch_s, [])
                continue
            notice = self.times[self.next] if self.next < len(self.times) else math.inf
            upscale = repaired + p.upscale_wait_s
            until = min(notice, upscale, horizon)
            self.train(t, until)
            t = until
            if t >= horizon:
                break
            if notice <= upscale:  # train through the notice, then reconfigure for all announced by then
                end_of_notice = min(t + p.notice_s, horizon)
                taken = self.take(end_of_notice)
                self.train(t, end_of_notice)
                length = p.restart_s if not self.elastic else p.downscale_s + p.downscale_per_slice_s * len(taken)
                t = end_of_notice if end_of_notice >= horizon else self.pause(end_of_notice, length, taken)
            else:
                t = self.pause(t, p.upscale_s, [])


def simulate_unit(
    chips: int,
    slices: int,
    times: list[float],
    hit: list[int],
    repair_s: list[float],
    p: SimParams,
    *,
    elastic: bool,
    fetch_s: float = 0.0,
) -> UnitRun:
    """Run one unit over ``p.horizon_s``; interruptions (announced at ``times``, sorted) hit slices ``hit``.
    ``fetch_s``: what an elastic unit that lost every slice spends bootstrapping before it trains again."""
    run = UnitRun(chips=chips, slices=slices, interruptions=len(times))
    unit = _Unit(run, times, hit, repair_s, p, elastic, fetch_s)
    unit.loop()
    for start, end, live in zip(run.seg_start, run.seg_end, run.seg_live, strict=True):
        share = live / slices
        f = straggler_factor(live, p.jitter)
        run.seg_useful.append(chips * share * f)
        run.useful += chips * (end - start) * share * f
        run.lost["straggler"] += chips * (end - start) * share * (1 - f)
        run.lost["repair"] += chips * (end - start) * (1 - share)
    run.lost["reconfiguring"] = chips * unit.paused
    run.lost["repair"] += chips * unit.idle
    return run
