"""What each instance of a dry run runs, and where: the instance specs, per local provider.

A ``process`` instance sees this machine's files, so its command line names
the run directory directly; a ``docker`` instance is a VM that gets its files
copied in (``/opt/ddctl/...``) and reaches the syncer over its region's
network. :class:`Topology` answers the only question that differs between
regions: how a learner of region R reaches the syncer and its notices.
"""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass, field

from ddctl.config.regions import Region
from ddctl.control.credentials import token_for
from ddctl.control.state import run_dir
from ddctl.providers.base import InstanceSpec
from ddctl.providers.deploy import REMOTE_ROOT
from ddctl.providers.docker.metadata import NOTICE_PATH
from ddctl.providers.linkshape import ShapedLink

SYNCER_PORT = 8443
"""The syncer's port inside a Docker VM (each VM has its own network stack)."""
SYNCER_FILES = ("job.json", "secret", "tls/ca.pem", "tls/server.pem", "tls/server.key")
"""What a remote syncer needs of the job directory (never the CA's private key)."""
DEAD_MAN_S = 120.0


@dataclass(frozen=True, slots=True)
class Topology:
    """The dry run's network: one provider for every region, and how each region reaches the syncer."""

    kind: str  # process | docker
    syncer_region: str
    netns: dict[str, ShapedLink] = field(default_factory=dict)
    """process: the shaped namespace of each region that has a link profile."""
    subnets: dict[str, ipaddress.IPv4Network] = field(default_factory=dict)
    """docker: each region's network."""
    metadata_port: int = 0

    def syncer_ip(self, region: str) -> str:
        if self.kind == "docker":
            return str(self.subnets[region][250])
        link = self.netns.get(region)
        return link.host_ip if link else "127.0.0.1"

    def syncer_hosts(self) -> list[str]:
        """Every address the syncer's certificate must name."""
        regions = self.subnets if self.kind == "docker" else self.netns
        return sorted({"127.0.0.1", "localhost", *(self.syncer_ip(r) for r in regions)})

    def notice_url(self, region: str) -> str | None:
        if self.kind != "docker" or not self.metadata_port:
            return None
        return f"http://{self.subnets[region][1]}:{self.metadata_port}{NOTICE_PATH}"


def python() -> str:
    return sys.executable


def syncer_spec(run: str, topology: Topology, image_python: str) -> InstanceSpec:
    root = run_dir(run)
    log = root / "logs" / "syncer.log"
    common = ("--eval-every", "30")
    if topology.kind == "docker":
        job = f"{REMOTE_ROOT}/job"
        argv = (image_python, "-m", "ddctl_agents.service", "--job-dir", job, "--state-dir", f"{REMOTE_ROOT}/state")
        return InstanceSpec(
            run=run,
            name="syncer",
            region=topology.syncer_region,
            role="syncer",
            argv=(*argv, "--bind", f"0.0.0.0:{SYNCER_PORT}", *common),
            log=log,
            files={f"{job}/{name}": str(root / "job" / name) for name in SYNCER_FILES},
            disks={f"{REMOTE_ROOT}/state": str(root / "syncer-state")},
        )
    bind = "0.0.0.0" if topology.netns else "127.0.0.1"
    argv = (python(), "-m", "ddctl_agents.service", "--job-dir", str(root / "job"), "--bind", f"{bind}:0")
    return InstanceSpec(
        run=run,
        name="syncer",
        region=topology.syncer_region,
        role="syncer",
        argv=(*argv, "--port-file", str(root / "syncer.port"), *common),
        log=log,
    )


def learner_spec(run: str, topology: Topology, region: Region, learner: str, port: int, image_python: str) -> InstanceSpec:
    """A learner of ``region``: inside its shaped namespace (process) or its region's VM (docker)."""
    root = run_dir(run)
    token = root / "tokens" / learner
    token.parent.mkdir(parents=True, exist_ok=True)
    token.touch(mode=0o600)
    token.write_text(token_for(root / "job", learner))
    url = f"https://{topology.syncer_ip(region.name)}:{port}"
    log = root / "logs" / f"{learner}.log"
    link = (region.link.up_mbps, region.link.down_mbps) if region.link else None
    if topology.kind == "docker":
        notice = topology.notice_url(region.name)
        return InstanceSpec(
            run=run,
            name=learner,
            region=region.name,
            role="learner",
            argv=(
                image_python,
                *_learner_args(learner, region.name, url, f"{REMOTE_ROOT}/token", f"{REMOTE_ROOT}/ca.pem"),
                "--summary",
                f"{REMOTE_ROOT}/summary.json",
                *(("--notice-url", notice) if notice else ()),
            ),
            log=log,
            files={f"{REMOTE_ROOT}/token": str(token), f"{REMOTE_ROOT}/ca.pem": str(root / "job" / "tls" / "ca.pem")},
            link=link,
            summary=f"{REMOTE_ROOT}/summary.json",
        )
    shaped = topology.netns.get(region.name)
    summary = str(root / "summaries" / f"{learner}.json")
    argv = (
        *(shaped.command() if shaped else ()),
        python(),
        *_learner_args(learner, region.name, url, str(token), str(root / "job" / "tls" / "ca.pem")),
        "--summary",
        summary,
    )
    return InstanceSpec(run=run, name=learner, region=region.name, role="learner", argv=argv, log=log, summary=summary)


def _learner_args(learner: str, region: str, url: str, token: str, ca: str) -> tuple[str, ...]:
    return (
        "-m",
        "ddctl_agents.agent",
        "--syncer",
        url,
        "--name",
        learner,
        "--token-file",
        token,
        "--ca",
        ca,
        "--region",
        region,
        "--syncer-timeout",
        str(DEAD_MAN_S),
    )


def helper_spec(run: str, name: str, region: str, module: str, *args: str) -> InstanceSpec:
    """A control-plane process on this machine (the controller, the metadata endpoint)."""
    return InstanceSpec(
        run=run,
        name=name,
        region=region,
        role=name,
        argv=(python(), "-m", module, "--run", run, *args),
        log=run_dir(run) / "logs" / f"{name}.log",
    )
