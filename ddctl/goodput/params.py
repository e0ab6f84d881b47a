"""The simulator's mechanisms and their defaults, and parsing of sizes and durations.

The defaults are calibrated on the paper's two data-parallel rows only
(``docs/calibrate_simulator.py``): notice and restart time from the
non-elastic row, the downscale and upscale pauses from the elastic row. The
Decoupled rows are then predictions of the same mechanisms applied to M
smaller elastic learners.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

from ddctl.errors import SimError

YEAR_S = 365.25 * 86400.0
SYSTEMS_BASE = ("dp", "elastic_dp")
GRID_LEARNERS = (2, 4, 8, 16)
GRID_CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimParams:
    """Every mechanism of the model, with its default (seconds unless named otherwise)."""

    mtbi_s: float = YEAR_S
    """Per-chip mean time between interruptions; failures are Poisson."""
    slice_chips: int = 256
    """Chips per slice: what an elastic job drops on a failure and adds back once repaired."""
    notice_s: float = 6.0
    """An interruption is announced this long before its chip goes down; the job trains through it and
    one reconfiguration handles every interruption announced by its end (0: sudden failures)."""
    restart_s: float = 90.0
    """Non-elastic data-parallel: the whole job stops, swaps in spare slices, reloads and recompiles."""
    downscale_s: float = 20.0
    """Elastic: the whole unit (job or learner) pauses to drop failed slices."""
    downscale_per_slice_s: float = 4.0
    """... plus this much per slice it drops (re-sharding the batch and the data)."""
    upscale_s: float = 2.0
    """Elastic: the whole unit pauses to add repaired slices back ..."""
    upscale_wait_s: float = 30.0
    """... unless a reconfiguration comes within this long of the repair and adds them for free."""
    repair_scale_s: float = 300.0
    """Repair time is exponentiated Weibull (heavy-tailed): scale ..."""
    repair_shape: float = 0.5
    """... shape k (< 1: a heavy tail) ..."""
    repair_power: float = 1.5
    """... and exponent a; mean with the defaults is about 14 minutes."""
    jitter: float = 0.0
    """Per-slice step-time coefficient of variation; a synchronous step waits for the slowest slice."""
    fetch_s: float = 30.0
    """Decoupled: a learner that lost every slice fetches the current fragments before training again."""
    quorum: int = 1
    """K: learners that must be training for the global model to advance (and the others not to block)."""
    days: float = 7.0
    """Simulated time per run."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not math.isfinite(value) or value < 0:
                raise SimError(f"{f.name} must be a finite number >= 0, got {value}")
        for name in ("mtbi_s", "slice_chips", "repair_scale_s", "repair_shape", "repair_power", "days", "quorum"):
            if getattr(self, name) <= 0:
                raise SimError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0

    def mean_repair_s(self) -> float:
        """E[R] of the exponentiated Weibull, by quadrature of its quantile function."""
        n = 20_000
        return float(sum(repair_quantile((i + 0.5) / n, self) for i in range(n)) / n)


def repair_quantile(u: float, p: SimParams) -> float:
    """Inverse CDF of F(x) = (1 - exp(-(x/scale)^k))^a."""
    return float(p.repair_scale_s * (-math.log1p(-(u ** (1 / p.repair_power)))) ** (1 / p.repair_shape))


def system_name(learners: int) -> str:
    return f"decoupled_m{learners}"


def grid_systems() -> tuple[str, ...]:
    return (*SYSTEMS_BASE, *(system_name(m) for m in GRID_LEARNERS))


def learners_of(system: str) -> int:
    """Units a system splits its chips into: 1 for data-parallel, M for Decoupled."""
    if system in SYSTEMS_BASE:
        return 1
    match = re.fullmatch(r"decoupled_m(\d+)", system)
    if not match or int(match.group(1)) < 1:
        raise SimError(f"unknown system {system!r}; allowed: dp, elastic_dp, decoupled_mM (M >= 1)")
    return int(match.group(1))


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w|y|mo)?\s*$")
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "mo": YEAR_S / 12, "y": YEAR_S}


MAX_CHIPS = 100_000_000
"""40x the paper's largest job (2.4M chips); past it a cell's arrays outgrow memory."""


def parse_chips(text: str) -> int:
    """'1.2m' -> 1_200_000; '150k' -> 150_000; '4096' -> 4096."""
    match = _SIZE.match(text)
    if not match:
        raise SimError(f"chips {text!r} must be a count like 150k, 1.2m or 4096")
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6}[match.group(2).lower()]
    if value < 1 or value != round(value) or value > MAX_CHIPS:
        raise SimError(f"chips {text!r} must be a whole number of chips in [1, {MAX_CHIPS:,}]")
    return int(round(value))


def parse_duration(text: str) -> float:
    """'1y' -> seconds; units s, m, h, d, w, mo, y; a bare number is seconds."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise SimError(f"duration {text!r} must be a positive number with a unit of s, m, h, d, w, mo or y (e.g. 1y, 6mo)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
