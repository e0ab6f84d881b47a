"""Providers: where instances run. One registry; each provider lives in its own module or folder.

A new provider adds its module and one line to ``KINDS``, and nothing outside
``providers/``: the control plane speaks only the contract of ``base.py``.
Modules are imported on demand, so ``ddctl --help`` never loads a cloud SDK and
Docker is needed only when it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass

from ddctl.errors import DdctlError
from ddctl.providers.base import Provider


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    factory: str
    """``module:Class`` of the provider."""
    local: bool
    """It plays regions on this machine (a dry run's providers); clouds are not."""
    prices: str = ""
    """The module that prices its regions for ``up --plan`` (``quote_regions``, ``notes``); empty: free."""
    gpus: str = ""
    """``module:function`` giving the GPUs an instance type comes with, ``(model, count)`` or None; empty: no table."""


KINDS: dict[str, Kind] = {
    "process": Kind("process", "ddctl.providers.process:ProcessProvider", local=True),
    "docker": Kind("docker", "ddctl.providers.docker.vms:DockerProvider", local=True),
    "fake": Kind("fake", "ddctl.providers.fake:FakeProvider", local=True),
    "aws": Kind(
        "aws",
        "ddctl.providers.aws.provider:AwsProvider",
        local=False,
        prices="ddctl.providers.aws.prices",
        gpus="ddctl.providers.aws.prices:gpus",
    ),
    "gcp": Kind(
        "gcp",
        "ddctl.providers.gcp.provider:GcpProvider",
        local=False,
        prices="ddctl.providers.gcp.prices",
        gpus="ddctl.providers.gcp.prices:gpus",
    ),
}
PLANNED: tuple[str, ...] = ()
"""Accepted in regions.yaml but not built: ``up`` refuses them before it makes anything, ``up --dry-run`` plays them."""
LOCAL_KINDS = tuple(k for k, kind in KINDS.items() if kind.local and k != "fake")


def get(kind: str) -> Provider:
    """The provider for ``kind``."""
    require_built([kind])
    module, _, name = KINDS[kind].factory.partition(":")
    provider: Provider = getattr(importlib.import_module(module), name)()
    return provider


def instance_gpus(kind: str, instance_type: str) -> tuple[str, int] | None:
    """The GPUs ``instance_type`` comes with, (model, count), from the provider's tables (GCP's a2-highgpu-8g:
    8 A100; AWS's g5.12xlarge: 4 A10G), so regions.yaml can default and bound ranks per learner; None: none,
    or the tables do not know."""
    chosen = KINDS.get(kind)
    if chosen is None or not chosen.gpus or not instance_type:
        return None
    module, _, name = chosen.gpus.partition(":")
    found: tuple[str, int] | None = getattr(importlib.import_module(module), name)(instance_type)
    return found


def require_built(kinds: Iterable[str]) -> None:
    """Refuse a kind that is not built yet, saying what is built and what a dry run does instead."""
    for kind in sorted(set(kinds)):
        if kind not in KINDS:
            built = ", ".join(k for k in KINDS if k != "fake")
            raise DdctlError(
                f"provider {kind!r} is not built yet; built: {built} "
                "(`ddctl up --dry-run` plays every region of the file on this machine)"
            )


def unavailable(kind: str) -> str | None:
    """Why ``kind`` cannot be used on this machine now, or None (Docker needs an engine that answers)."""
    if kind == "docker":
        from ddctl.providers.docker.engine import engine_unavailable

        return engine_unavailable()
    return None


def dry_run_kind(requested: set[str]) -> tuple[str, str | None]:
    """The one local provider a dry run plays these regions with, and a note when it is not what was asked.

    Every region runs on the same local provider (their networks must reach each other): Docker VMs
    when an engine answers and any region asked for something else than ``process``, else processes."""
    if requested <= {"process"}:
        return "process", None
    why = unavailable("docker")
    if why:
        return "process", f"{why}; every region runs as local processes instead"
    return "docker", None
