"""Start an instance on any provider: provision it, then (on a machine of its own) deploy its agent.

The one place the shared deploy runs: a provider whose instance has an SSH
target gets the agent bundle, the instance's files and its command over
asyncssh, with pinned host keys; a provider without one (local processes) ran
the command in ``create``. A deploy that fails leaves no half-started machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ddctl.providers import deploy
from ddctl.providers.base import Instance, InstanceSpec, Provider

if TYPE_CHECKING:
    from ddctl.control.reconcile import Placement


def launch(provider: Provider, spec: InstanceSpec, on_created: Callable[[Instance], object] | None = None) -> Instance:
    """``provider.create(spec)``, ``on_created`` (the syncer's port opened to it), then the agent over SSH where there is a
    machine to deploy to."""
    instance = provider.create(spec)
    try:
        if on_created is not None:
            on_created(instance)
        target = provider.ssh_target(instance)
    except BaseException:
        provider.terminate(instance, grace_s=0.0)
        raise
    if target is None:
        return instance
    try:
        files = {remote: Path(local).read_bytes() for remote, local in spec.files.items()}
        deploy.deploy(target, deploy.build_bundle(), files, list(spec.argv), env=spec.env, on_exit=provider.power_off)
    except BaseException:
        provider.terminate(instance, grace_s=0.0)
        raise
    return instance


def launch_at(
    provider: Provider, spec: InstanceSpec, placement: Placement | None, on_created: Callable[[Instance], object] | None = None
) -> tuple[InstanceSpec, Instance]:
    """``launch`` at ``placement`` (None: where the spec says); a refusal is raised classified, for failover to decide on."""
    if placement is not None:
        spec = replace(spec, cloud_region=placement.cloud_region, zone=placement.zone)
    try:
        return spec, launch(provider, spec, on_created)
    except Exception as exc:
        raise provider.classify(exc) from exc
