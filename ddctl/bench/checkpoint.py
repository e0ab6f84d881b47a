"""What a checkpoint costs, behind ``ddctl bench checkpoint``: against ``torch.save`` / ``torch.load`` of the same
parameters to the same disk, measured in the same run.

Why: the syncer checkpoints while rounds go on, so its cost is time its I/O thread is busy and disk it
holds; reading one back is what ``pull`` and ``up --resume-from`` wait for. Ours also hashes every file
and checks every tensor (names, shapes, finite values); the ratio says what that safety costs.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddctl_agents.errors import ConfigError


def measure_checkpoint(preset: str = "small", repeats: int = 3, folder: Path | None = None) -> dict[str, Any]:
    """Best-of-``repeats`` seconds to write (encode, hash, fsync) and to read (hash, parse, check) a checkpoint of
    ``preset``'s parameters, and the same for ``torch.save`` / ``torch.load``; bytes of each."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    import torch

    from ddctl_agents.train.checkpoint import encode, load
    from ddctl_agents.train.model import build_model
    from ddctl_agents.train.presets import get_preset

    config = get_preset(preset)
    params = {n: p.detach() for n, p in build_model(config, seed=0).named_parameters()}
    momentum = {n: torch.randn_like(t) for n, t in params.items()}  # its own storage: torch.save would share it
    manifest = {"run": "bench", "created_at": 0.0, "rounds": 0, "versions": [0], "vclock": {}, "tokens": {}, "steps": {},
                "val_bpb": None, "model": {}, "job": {}, "job_sha256": "0" * 64}  # fmt: skip
    shapes = {n: tuple(t.shape) for n, t in params.items()}
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        root = Path(tmp)

        def write_ours() -> None:
            for name, data in encode(params, momentum, manifest).items():
                _durable(root / name, data)

        def write_torch() -> None:
            torch.save({"model": params, "outer": momentum}, root / "torch.pt")
            with (root / "torch.pt").open("rb+") as f:
                os.fsync(f.fileno())

        ours_write, torch_write = _best(write_ours, repeats), _best(write_torch, repeats)
        ours_read = _best(lambda: load(lambda n, _: (root / n).read_bytes(), shapes), repeats)
        torch_read = _best(lambda: torch.load(root / "torch.pt"), repeats)
        ours_bytes = sum(p.stat().st_size for p in root.iterdir() if p.name != "torch.pt")
        torch_bytes = (root / "torch.pt").stat().st_size
    return {
        "preset": preset,
        "params": sum(t.numel() for t in params.values()),
        "write_s": ours_write,
        "torch_save_s": torch_write,
        "write_ratio": round(ours_write / torch_write, 3),
        "read_s": ours_read,
        "torch_load_s": torch_read,
        "read_ratio": round(ours_read / torch_read, 3),
        "bytes": ours_bytes,
        "torch_bytes": torch_bytes,
    }


def _durable(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(min(times), 5)
