"""How steeply a late update should be discounted: the virtual cluster, one slow learner, late weights compared.

``late_weight: staleness`` divides a late contribution's weight by ``1 + s`` (s: the versions its base is behind).
This ablation tries other discounts without adding them to the product: ``(1 + s) ** POWER`` (POWER 0 is the
``period`` rule, 1 is ``staleness``, 2 steeper), and ``drop`` (a late contribution weighs nothing, so the slow
learner's late drift never moves the model beside a fresh update: its work counts only where it lands on time; a
round of late updates alone, the job's final drain, still takes them, as the weights are shares). Each configuration runs
``ddctl train --learners 4 --tokens T --cadences 1,1,1,K --seed S --threads 1 --late-weight staleness --json`` in a
process of its own with ``merge.Contribution.weight`` replaced; a run replays bit for bit, so one run per seed is the
figure and POWER 1 reproduces the product's own.

    .venv/bin/python docs/measure_late_discount.py --discounts 1,2,drop --cadences 4,8 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

DISCOUNT = "DDCTL_MEASURE_LATE_DISCOUNT"


def _patched_train(argv: list[str]) -> None:
    """Run ``ddctl train`` with the discount named by ``$DDCTL_MEASURE_LATE_DISCOUNT``."""
    from ddctl_agents.core import merge

    discount = os.environ[DISCOUNT]

    def weight(self: merge.Contribution) -> float:
        one_period = merge.token_weight(self.c_tokens, self.c_steps) / self.periods
        if discount == "drop":
            return float(one_period) if self.stale == 0 else 1e-12  # on time as before; late: no say in the merge
        return float(one_period / (1 + self.stale) ** float(discount))

    merge.Contribution.weight = property(weight)  # type: ignore[assignment,method-assign]
    from ddctl.cli.app import app

    app(["train", *argv])


def _run(discount: str, cadence: int, seed: int, tokens: int) -> float:
    argv = ["--learners", "4", "--tokens", str(tokens), "--cadences", f"1,1,1,{cadence}", "--seed", str(seed),
            "--threads", "1", "--late-weight", "staleness", "--json"]  # fmt: skip
    done = subprocess.run([sys.executable, __file__, "--one", *argv], env={**os.environ, DISCOUNT: discount},
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:  # what ddctl train said (a cadence it refuses, ...), not this script's traceback
        sys.exit(f"ddctl train {' '.join(argv)} (discount {discount}) exited {done.returncode}:\n{done.stderr.strip()}")
    return float(json.loads(done.stdout)["val_bpb"])


def _discounts(text: str) -> list[str]:
    """``--discounts``: each a number (POWER) or ``drop``, checked here so a bad one is refused before any run."""
    chosen = text.split(",")
    for d in chosen:
        try:
            ok = d == "drop" or float(d) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(f"each discount is a POWER >= 0 or drop, got {d!r}")
    return chosen


def _ints(text: str) -> list[int]:
    """``--cadences`` and ``--seeds``: comma-separated integers."""
    try:
        return [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, got {text!r}") from None


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        _patched_train(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--discounts", type=_discounts, default="0,1,2,drop", help="POWER of (1 + s), or drop, comma-separated")
    parser.add_argument("--cadences", type=_ints, default="4,8", help="the slow learner's cadence K, comma-separated")
    parser.add_argument("--seeds", type=_ints, default="0,1,2")
    parser.add_argument("--tokens", type=int, default=1_000_000)
    args = parser.parse_args()
    seeds = args.seeds
    rows = []
    for cadence in args.cadences:
        for discount in args.discounts:
            bpb = [_run(discount, cadence, seed, args.tokens) for seed in seeds]
            rows.append({"cadence": cadence, "discount": discount, "val_bpb": bpb, "mean": statistics.fmean(bpb)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"tokens": args.tokens, "seeds": seeds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
