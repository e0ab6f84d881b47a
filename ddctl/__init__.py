"""ddctl: the laptop side of cross-region Decoupled DiLoCo training.

CLI, planning, the in-process virtual cluster, the data-parallel baseline and
the benchmarks. What runs in the regions lives in ``ddctl_agents``.
"""

__version__ = "0.1.0"
