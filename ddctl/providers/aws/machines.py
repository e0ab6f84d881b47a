"""What one EC2 instance is asked to be: its ``RunInstances`` request, user data and tags (pure).

The request is built here and nowhere else, so a test reads exactly what EC2
is sent. A learner is spot (one-time, terminated on interruption), the syncer
on-demand; both terminate when their OS shuts down, so the agent's exit (its
dead-man too) powers the VM off for good. IMDSv2 is required (no token, no
metadata). The user data is what cloud-init runs as root at first boot: it
installs the host key ddctl generated (pinned in ``known_hosts`` before the VM
exists), the run's client key, the power-off hook (``console.py``), and the agents' Python where
the image lacks it; ``/opt/ddctl/ready`` says it is done.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ddctl.providers.aws.console import power_off_hook
from ddctl.providers.base import NAME_LABEL, RUN_LABEL, InstanceSpec
from ddctl.providers.deploy import REMOTE_ROOT

if TYPE_CHECKING:
    from ddctl.config.regions import Region

ROLE_TAG = "ddctl-role"
REGION_TAG = "ddctl-region"
HOST_KEY_TAG = "ddctl-host-key"
EXPIRES_TAG = "ddctl-expires-at"
POWER_OFF = f"{REMOTE_ROOT}/poweroff"
READY = f"{REMOTE_ROOT}/ready"
AGENT_REQUIREMENTS = (
    "torch==2.13.0",
    "numpy>=1.26",
    "httpx[http2]>=0.27",
    "hypercorn>=0.17,<0.19",
    "cryptography>=42",
    "prometheus-client>=0.20",
    "pydantic>=2.7,<3",
)
"""What the agents import, installed into the VM's own venv when the image has no interpreter at ``python``."""
DEFAULT_PYTHON = "/opt/ddctl/venv/bin/python"
"""Where the user data puts the agents' interpreter when the region names none."""
DEFAULT_IMAGE_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
"""A public SSM parameter naming the current Deep Learning Base AMI (NVIDIA driver, CUDA, Ubuntu 22.04)."""
LIVE_STATES = ("pending", "running")


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """How a region's VMs are made: from regions.yaml, carried in each instance's spec."""

    image: str
    python: str
    spot: bool
    max_price: float | None = None


def tags(spec: InstanceSpec, host_key: str, expires_at: float) -> dict[str, str]:
    """The labels that make the instance findable (and removable) with the local state gone."""
    return {
        RUN_LABEL: spec.run,
        NAME_LABEL: spec.name,
        ROLE_TAG: spec.role,
        REGION_TAG: spec.region,
        HOST_KEY_TAG: host_key,
        EXPIRES_TAG: datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "Name": f"ddctl-{spec.run}-{spec.name}",
    }


def user_data(host_private: bytes, host_public: str, client_public: str, python: str) -> str:
    """The first-boot script: pinned host key, the run's client key, power-off hook, the agents' Python."""
    venv = f"{REMOTE_ROOT}/venv"
    install = (
        f"if [ ! -x {shlex.quote(python)} ]; then\n"
        f"  python3 -m venv {venv} && {venv}/bin/pip install -q {shlex.join(AGENT_REQUIREMENTS)}\n"
        "fi\n"
    )
    return (
        "#!/bin/sh\n"
        "# ddctl first boot: the host key ddctl pinned, the run's key, the power-off hook, the agents' Python.\n"
        "set -e\n"
        f"mkdir -p /etc/ssh /root/.ssh {REMOTE_ROOT}\n"
        "umask 077\n"
        f"cat >/etc/ssh/ssh_host_ed25519_key <<'KEY'\n{host_private.decode().strip()}\nKEY\n"
        f"echo {shlex.quote(host_public)} >/etc/ssh/ssh_host_ed25519_key.pub\n"
        f"echo {shlex.quote(client_public)} >/root/.ssh/authorized_keys\n"
        "umask 022\n"
        f"cat >{POWER_OFF} <<'HOOK'\n{power_off_hook()}HOOK\nchmod 755 {POWER_OFF}\n"
        "(systemctl restart ssh || systemctl restart sshd) >/dev/null 2>&1 || true\n"
        f"{install}"
        f"touch {READY}\n"
    )


def launch_request(
    spec: InstanceSpec,
    machine: Machine,
    *,
    instance_type: str,
    subnet: str,
    security_group: str,
    key_name: str,
    user_data: str,
    tags: dict[str, str],
) -> dict[str, Any]:
    """The ``RunInstances`` keyword arguments for ``spec`` on ``machine`` in ``subnet``."""
    tag_list = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    request: dict[str, Any] = {
        "ImageId": machine.image,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "KeyName": key_name,
        "UserData": user_data,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "NetworkInterfaces": [
            {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [security_group], "AssociatePublicIpAddress": True}
        ],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tag_list}, {"ResourceType": "volume", "Tags": tag_list}],
    }
    if machine.spot:
        options: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if machine.max_price is not None:
            options["MaxPrice"] = f"{machine.max_price:.4f}"
        request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    return request


def tag_map(raw: dict[str, Any]) -> dict[str, str]:
    """An EC2 description's ``Tags`` list as a dict."""
    return {str(t.get("Key")): str(t.get("Value")) for t in raw.get("Tags") or [] if isinstance(t, dict)}


def machine_settings(region: Region, syncer_region: str, ssh_from: str) -> dict[str, Any]:
    """What ``create`` needs to know of a region, carried in each of its instances' specs."""
    return {
        "instance_types": list(region.types),
        "image": region.image,
        "python": region.python or DEFAULT_PYTHON,
        "spot": region.spot,
        "max_price": region.price_cap,
        "vpc": region.vpc,
        "syncer_region": syncer_region,
        "ssh_from": ssh_from,
    }


def public_address(raw: dict[str, Any]) -> str | None:
    """The instance's public IPv4 address as EC2 described it, if it is one (it becomes an SSH host and a /32 rule)."""
    try:
        return str(ipaddress.IPv4Address(str(raw.get("PublicIpAddress") or "")))
    except ValueError:
        return None
