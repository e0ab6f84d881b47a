"""Charts of the simulator's results (matplotlib, drawn off-screen to a PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddctl.goodput.params import GRID_CHIPS


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_grid(table: dict[str, Any], path: Path) -> None:
    """Goodput against chips for every system (lines, with 95% intervals), the paper's values as markers."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    chips = [c / 1e6 for c in GRID_CHIPS]
    for system, row in table["goodput"].items():
        means = [row[str(c)] for c in GRID_CHIPS]
        ci = [table["goodput_ci95"][system][str(c)] for c in GRID_CHIPS]
        line = ax.errorbar(chips, means, yerr=ci, marker="o", markersize=3, capsize=2, label=system)
        paper = [table["paper"][system][str(c)] for c in GRID_CHIPS]
        ax.plot(chips, paper, linestyle="none", marker="x", color=line[0].get_color())
    ax.set_xscale("log")
    ax.set_xticks(chips, [f"{c:g}M" for c in chips])
    ax.minorticks_off()
    ax.set_xlabel("chips")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(
        f"Goodput, MTBI {table['params']['mtbi_s'] / 31_557_600:g} y, {table['seeds']} seeds x {table['days']:g} days (x: paper)"
    )
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_cell(result: dict[str, Any], path: Path) -> None:
    """Goodput and uptime of each system of one cell, as bars with 95% intervals."""
    plt = _pyplot()
    systems = list(result["systems"])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    xs = range(len(systems))
    for offset, key in ((-0.2, "goodput"), (0.2, "uptime")):
        values = [result["systems"][s][key] for s in systems]
        errors = [result["systems"][s][f"{key}_ci95"] for s in systems]
        ax.bar([x + offset for x in xs], values, width=0.4, yerr=errors, capsize=3, label=key)
    ax.set_xticks(list(xs), systems)
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.legend()
    ax.set_title(f"{result['chips']:,} chips, MTBI {result['mtbi_s'] / 31_557_600:g} y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
