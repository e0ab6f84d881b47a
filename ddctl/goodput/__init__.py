"""The goodput simulator: Decoupled DiLoCo against data-parallel training at millions of chips.

Pure and deterministic for a seed: failures, repairs and pauses are sampled
from numpy generators seeded per cell, and every system of a cell sees the
same failures (common random numbers), so their differences are the systems'.
"""
