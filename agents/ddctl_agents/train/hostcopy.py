"""Copies between a learner's device and host memory that never stall its training stream.

The outer machinery lives on the host: anchors (the version each fragment's
drift is measured from) and snapshots of drifting parameters sit in pinned
memory, where the encoder reads them and where a DMA engine can fill them while
the GPU keeps computing.

- ``to_host``: the values are cloned on the main stream (device-to-device, a few
  microseconds), then a side stream copies the clones into pinned buffers while
  the next steps run; ``Snapshot.ready`` polls the copy without blocking,
  ``Snapshot.wait`` blocks only on it. The clone is what makes this safe: the
  optimiser may overwrite the parameters before the side stream gets to them.
- ``anchor``: a pinned fp32 host copy of a value that arrived from the network.
- ``to_device``: an asynchronous host-to-device copy queued on the main stream,
  so it lands between two steps.

On a CPU the same calls are plain synchronous copies (the CPU twin under test):
no stream, no pinning, identical values.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


class Snapshot:
    """Host copies of some tensors, possibly still in flight from the device."""

    def __init__(self, values: dict[str, Tensor], done: torch.cuda.Event | None = None) -> None:
        self._values, self._done = values, done

    def ready(self) -> bool:
        """True when ``wait`` would not block."""
        return self._done is None or bool(self._done.query())  # type: ignore[no-untyped-call]

    def wait(self) -> dict[str, Tensor]:
        """The fp32 host values, once their copy has finished."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        return self._values


class HostCopier:
    """Moves tensors between ``device`` and (pinned) host memory; see the module docstring."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self._side = torch.cuda.Stream(device) if self.pinned else None  # type: ignore[no-untyped-call]

    def anchor(self, value: Tensor) -> Tensor:
        """A host fp32 copy of ``value``, pinned on a GPU machine so it can feed an asynchronous copy."""
        out = torch.empty(value.shape, dtype=torch.float32, pin_memory=self.pinned)
        out.copy_(value)
        return out

    def to_host(self, tensors: Mapping[str, Tensor]) -> Snapshot:
        """Start copying ``tensors`` (device values) to the host; returns at once on a GPU."""
        if self._side is None:
            return Snapshot({name: t.detach().float().clone() for name, t in tensors.items()})
        main = torch.cuda.current_stream(self.device)
        clones = {name: t.detach().float().clone() for name, t in tensors.items()}
        self._side.wait_stream(main)
        values: dict[str, Tensor] = {}
        with torch.cuda.stream(self._side):
            for name, clone in clones.items():
                values[name] = torch.empty(clone.shape, dtype=torch.float32, pin_memory=True)
                values[name].copy_(clone, non_blocking=True)
                clone.record_stream(self._side)  # the allocator must not reuse it before the side stream is done
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self._side)
        return Snapshot(values, done)

    def to_device(self, host: Tensor, target: Tensor) -> None:
        """Overwrite ``target`` with ``host``; on a GPU queued on the main stream, between steps."""
        target.copy_(host.reshape(target.shape), non_blocking=self.pinned)


__all__ = ["HostCopier", "Snapshot"]
