"""Where a learner computes: device choice, its fast-math settings, and what it reports about itself.

On CUDA the inner loop runs matmuls in TF32 and the forward pass under bf16
autocast (parameters, gradients and AdamW state stay fp32); on a CPU it runs in
plain fp32, which is what every CPU test and replay is measured in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ddctl_agents.errors import ConfigError

DEVICE_CHOICES = ("auto", "cuda", "cpu")


def resolve_device(choice: str, local_rank: int = 0) -> torch.device:
    """``auto`` is this rank's GPU when CUDA has one, else the CPU; ``cuda`` without a GPU is an error."""
    if choice not in DEVICE_CHOICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICE_CHOICES)}; got {choice!r}")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False)")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"rank {local_rank} needs GPU {local_rank}, but this machine has {torch.cuda.device_count()}")
    return torch.device("cuda", local_rank)


def configure_math(device: torch.device) -> None:
    """TF32 for fp32 matmuls and convolutions on CUDA: ~8x the throughput, 10-bit mantissa inputs."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


@contextlib.contextmanager
def autocast(device: torch.device) -> Iterator[None]:
    """bf16 autocast on CUDA; nothing on the CPU, so CPU runs stay bit-reproducible fp32."""
    if device.type == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        yield


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """What a learner says about its hardware in heartbeats (the syncer derives MFU from it)."""

    accelerator: str
    """``cpu``, or the device name as CUDA gives it ("NVIDIA H100 80GB HBM3")."""
    memory_gb: float
    """One device's memory in GB (0 for a CPU: host memory is not what limits the model)."""


def describe(device: torch.device) -> DeviceReport:
    if device.type != "cuda":
        return DeviceReport(accelerator="cpu", memory_gb=0.0)
    props = torch.cuda.get_device_properties(device)
    return DeviceReport(accelerator=str(props.name)[:64], memory_gb=round(props.total_memory / 1e9, 1))


__all__ = ["DEVICE_CHOICES", "DeviceReport", "autocast", "configure_math", "describe", "resolve_device"]
