"""Providers: where instances run (local processes, Docker "VMs"; clouds next)."""

from __future__ import annotations

from ddctl.errors import DdctlError
from ddctl.providers.base import Provider

LOCAL_KINDS = ("process", "docker")


def get(kind: str) -> Provider:
    """The provider for ``kind``; imported on demand (Docker needs a daemon only when it is used)."""
    if kind == "process":
        from ddctl.providers.process import ProcessProvider

        return ProcessProvider()
    if kind == "docker":
        from ddctl.providers.docker.vms import DockerProvider

        return DockerProvider()
    raise DdctlError(f"provider {kind!r} is not built yet; built: {', '.join(LOCAL_KINDS)}")
