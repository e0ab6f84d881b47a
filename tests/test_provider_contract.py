"""The provider contract: the same lifecycle against every provider (fake, process, Docker, aws, gcp).

bootstrap (twice: idempotent) -> launch (create, then the shared deploy where
there is a machine) -> the instance is listed alive under the run's label ->
preempt ends it -> terminate and cleanup leave nothing -> a foreign error is
classified. Each provider passes the same assertions.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddctl import providers
from ddctl.config.regions import LinkProfile, Region
from ddctl.control.launch import launch
from ddctl.control.rundir import RunDir
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers import deploy
from ddctl.providers.base import InstanceSpec, Provider, RegionInfo
from ddctl_agents.waiting import wait_until

KINDS = ["fake", "process", *(pytest.param(k, marks=pytest.mark.slow) for k in ("docker", "aws", "gcp"))]
CLOUDS = ("aws", "gcp")


@pytest.fixture(params=KINDS)
def provider(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Provider]:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    kind = request.param
    why = providers.unavailable("docker" if kind in CLOUDS else kind)  # cloud VMs are Docker containers here (the hypervisor)
    if why:
        pytest.skip(f"{kind}: {why}")
    with contextlib.ExitStack() as stack:
        if kind == "aws":
            from aws_hypervisor import Hypervisor

            cloud = request.getfixturevalue("aws")  # moto's server; DDCTL_HOME and the SSH CIDR set for this test
            monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
            stack.enter_context(Hypervisor(cloud, regions=["us-east-1"]))
        if kind == "gcp":
            from aws_hypervisor import Hypervisor

            gcp = request.getfixturevalue("gcp")  # the fake Compute API; DDCTL_HOME and the SSH CIDR set for this test
            monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
            stack.enter_context(Hypervisor(request.getfixturevalue("aws_cloud"), regions=[], gcp=gcp))
        chosen = providers.get(kind)
        yield chosen
        for instance in chosen.list_run(run_of(tmp_path)):
            chosen.terminate(instance, grace_s=1.0)
        chosen.cleanup(run_of(tmp_path))


def region_for(kind: str) -> Region:
    """The region the contract runs in: what a file would say for this provider (local ones play "process")."""
    if kind == "aws":
        return Region(name="west", provider="aws", cloud_region="us-east-1", instance_type="t3.medium", image="ami-12c6146b",
                      python=sys.executable)  # fmt: skip
    if kind == "gcp":
        return Region(name="west", provider="gcp", cloud_region="us-central1", instance_type="e2-standard-2",
                      python=sys.executable)  # fmt: skip
    return Region(name="west", provider="docker" if kind == "docker" else "process", link=LinkProfile(up_mbps=50, down_mbps=50))


def run_of(tmp_path: Path) -> str:
    return f"contract{abs(hash(tmp_path)) % 10_000}"


def spec(run: str, region: Region, info: RegionInfo) -> InstanceSpec:
    """A learner-like instance whose agent just sleeps (and leaves on SIGTERM)."""
    argv = (
        *info.command_prefix,
        info.python,
        "-c",
        "import signal, sys, time; signal.signal(15, lambda *a: sys.exit(0)); time.sleep(600)",
    )
    return InstanceSpec(
        run=run, name="L0", region=region.name, role="learner", argv=argv, log=RunDir(run).log("L0"),
        cloud_region=region.cloud_region, machine=info.machine,
    )  # fmt: skip


def test_the_lifecycle_holds_on_every_provider(provider: Provider, tmp_path: Path) -> None:
    run = run_of(tmp_path)
    regions = [region_for(provider.kind)]
    infos = provider.bootstrap(run, regions, "west")
    again = provider.bootstrap(run, regions, "west")
    assert infos == again and set(infos) == {"west"}  # idempotent
    info = infos["west"]
    assert info.provider == provider.kind and info.python and info.syncer_host
    if info.remote:
        RunDir(run).known_hosts.parent.mkdir(parents=True, exist_ok=True)
    started = launch(provider, spec(run, regions[0], info))
    listed = {i.name: i for i in provider.list_run(run)}
    assert listed["L0"].alive and listed["L0"].provider_id == started.provider_id
    target = provider.ssh_target(listed["L0"])
    if target is not None:  # a machine of its own: reachable with the run's key and its pinned host key
        status, out, _ = deploy.run_command(target, "cat /opt/ddctl/agent.pid")
        assert status == 0 and out.strip().isdigit()
    provider.preempt(listed["L0"], notice_s=2.0)

    def ended() -> bool:
        return not any(i.alive for i in provider.list_run(run) if i.name == "L0")

    wait_until(ended, timeout_s=30, what="the preempted instance to end")
    for instance in provider.list_run(run):
        provider.terminate(instance, grace_s=1.0)
    provider.terminate(started, grace_s=0.0)  # a second terminate is harmless
    provider.cleanup(run)
    assert provider.list_run(run) == []


def test_foreign_errors_are_classified(provider: Provider) -> None:
    error = provider.classify(RuntimeError("the SDK said no"))
    assert isinstance(error, ProvisionError) and error.kind in ("capacity", "quota", "credentials", "transient", "config")
    assert error.provider == provider.kind and "the SDK said no" in str(error)
    same = ProvisionError("x", kind="capacity", scope="zone")
    assert provider.classify(same) is same


def test_a_local_process_cannot_be_partitioned_and_says_why(tmp_path: Path) -> None:
    with pytest.raises(DdctlError, match="share this machine's network"):
        providers.get("process").cut_link("r", "west")


def test_the_registry_names_what_is_built() -> None:
    with pytest.raises(DdctlError, match="provider 'azure' is not built yet; built: process, docker, aws, gcp"):
        providers.get("azure")
    assert providers.PLANNED == () and providers.get("gcp").kind == "gcp"  # every kind regions.yaml accepts is built
    assert providers.dry_run_kind({"process"}) == ("process", None)


def test_launch_terminates_a_machine_whose_deploy_failed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ddctl.providers.fake import FakeProvider

    fake = FakeProvider()

    class Target:  # the fake has no machines; pretend this one does, and that deploying to it fails
        host = "10.0.0.9"

    monkeypatch.setattr(fake, "ssh_target", lambda instance: Target())

    def refuse(*args: object, **kwargs: object) -> None:
        raise DdctlError("sshd refused the key")

    monkeypatch.setattr(deploy, "deploy", refuse)
    with pytest.raises(DdctlError, match="refused the key"):
        launch(fake, InstanceSpec(run="r", name="L0", region="w", role="learner", argv=(sys.executable,), log=tmp_path / "l"))
    assert fake.list_run("r") == [] and ("terminate", "L0") in fake.calls
