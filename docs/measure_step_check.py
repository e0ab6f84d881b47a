"""The fused round's merge and step, and then the result's check, timed apart on one core.

One 8,388,608-parameter fragment (8 tensors), M = 8 int4 updates kept packed, RDA,
momentum held: ``fused_outer_step`` then ``check_result`` on what it returned, best
of 15 each. Before the step kept each new tensor's largest |value|, the check read
both new tensors again (torch.aminmax); run it on two checkouts, one after the other,
to compare (the machine is shared, so pair the runs):

    .venv/bin/python docs/measure_step_check.py
    (cd OTHER_CHECKOUT && python setup.py -q build_ext --inplace) && \\
        PYTHONPATH=OTHER_CHECKOUT:OTHER_CHECKOUT/agents .venv/bin/python docs/measure_step_check.py
"""

from __future__ import annotations

import json
import time

import torch

from ddctl.bench.rounds import _frames, _syncer
from ddctl_agents.core.admission import check_result
from ddctl_agents.core.config import OuterConfig
from ddctl_agents.core.fused_round import fused_outer_step
from ddctl_agents.core.merge import Contribution
from ddctl_agents.core.messages import decode_update


def main(repeats: int = 15) -> None:
    torch.set_num_threads(1)
    syncer = _syncer(8 * 2**20, 8, 8)
    updates = [decode_update(frame)[0] for frame in _frames(syncer, 8)]
    contributions = [Contribution(learner=u.learner, tensors=u.tensors, c_steps=u.c_steps, c_tokens=u.c_tokens) for u in updates]
    params = syncer.fragments[0]
    buffers = {name: torch.full_like(t, 1e-3) for name, t in params.items()}
    step_s, check_s, config = [], [], OuterConfig()
    for _ in range(repeats):
        started = time.perf_counter()
        result = fused_outer_step(params, buffers, contributions, embeddings=frozenset(), method="rda", config=config, taken=5)
        stepped = time.perf_counter()
        assert result is not None and check_result(*result, syncer.limits) is None
        step_s.append(stepped - started)
        check_s.append(time.perf_counter() - stepped)
    print(json.dumps({"merge_and_step_ms": round(min(step_s) * 1e3, 2), "result_check_ms": round(min(check_s) * 1e3, 2)}))


if __name__ == "__main__":
    main()
