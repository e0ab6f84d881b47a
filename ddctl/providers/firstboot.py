"""What every cloud VM runs at first boot, whatever the cloud: EC2 gets it as user data, GCE as its startup-script.

It installs the host key ddctl generated (pinned in ``known_hosts`` before the
VM exists), the run's client key, the power-off hook (``console.py``), and the
agents' Python where the image lacks it; ``/opt/ddctl/ready`` says it is done.
The operator's address (``ssh_cidr``) is what every cloud opens SSH to.
"""

from __future__ import annotations

import ipaddress
import os
import shlex

from ddctl.errors import DdctlError, DeployError
from ddctl.providers import deploy
from ddctl.providers.base import ipv4
from ddctl.providers.console import power_off_hook
from ddctl.providers.deploy import REMOTE_ROOT

LIFETIME_S = 7 * 24 * 3600.0
"""``ddctl-expires-at``: after this long a VM is an orphan for ``down --orphans``, whatever its run says."""
BOOT_TIMEOUT_S = 900.0
POWER_OFF = f"{REMOTE_ROOT}/poweroff"
READY = f"{REMOTE_ROOT}/ready"
SSH_FROM_ENV = "DDCTL_SSH_FROM"
"""The CIDR SSH is opened to (default: this machine's public address, asked of checkip.amazonaws.com)."""
AGENT_REQUIREMENTS = (
    "torch==2.13.0",
    "numpy>=1.26",
    "httpx[http2]>=0.27",
    "hypercorn>=0.17,<0.19",
    "cryptography>=42",
    "prometheus-client>=0.20",
    "pydantic>=2.7,<3",
    "safetensors>=0.4",
    "boto3>=1.34",
    "google-cloud-storage>=2.14",
)
"""What the agents import, installed into the VM's own venv when the image has no interpreter at ``python``."""
DEFAULT_PYTHON = "/opt/ddctl/venv/bin/python"
"""Where the user data puts the agents' interpreter when the region names none."""


def first_boot(host_private: bytes, host_public: str, client_public: str, python: str) -> str:
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


def ssh_cidr() -> str:
    """Where SSH may come from: ``DDCTL_SSH_FROM``, else this machine's public address as a /32."""
    chosen = os.environ.get(SSH_FROM_ENV)
    if chosen:
        try:
            return str(ipaddress.IPv4Network(chosen.strip(), strict=False))
        except ValueError:
            raise DdctlError(
                f"{SSH_FROM_ENV}={chosen[:60]!r} is not an IPv4 address or CIDR (e.g. 203.0.113.7 or 203.0.113.0/24)"
            ) from None
    import httpx

    try:
        answered = httpx.get("https://checkip.amazonaws.com", timeout=5.0).text.strip()
    except httpx.HTTPError as exc:
        raise DdctlError(f"cannot learn this machine's public address ({exc}); set {SSH_FROM_ENV}=CIDR") from None
    # the answer becomes the firewall rule SSH and the syncer's admin port are opened to: never a wider range
    address = ipv4(answered)
    if address is None:
        raise DdctlError(
            f"checkip.amazonaws.com answered {answered[:60]!r}, not this machine's IPv4 address; set {SSH_FROM_ENV}=CIDR"
        )
    return f"{address}/32"


def ready(target: deploy.Target) -> bool:
    """SSH answers and the first-boot script has finished (its marker exists)."""
    try:
        status, _, _ = deploy.run_command(target, f"test -e {READY}", wait_s=3.0)
    except DeployError:
        return False
    return status == 0
