"""The image a Docker "VM" boots from, built offline from what this machine already has.

No registry is reachable, so the image is a tiny root filesystem (passwd, an
sshd config, empty mount points, the ``/bin -> usr/bin`` links of a merged-usr
host) imported as one layer; the host's ``/usr`` (OpenSSH, the C library,
coreutils, tar) and its Python runtime (interpreter and virtual environment,
with torch) are bind-mounted read-only at the same paths. The agent bundle is
copied in over SSH like on a cloud VM. The tag is a hash of the content, so a
changed host gets a new image and an unchanged one is never rebuilt.

On machines with a registry, ``docker/Dockerfile`` builds a self-contained
image instead; point ``DDCTL_DOCKER_IMAGE`` at it.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ddctl.providers.docker.engine import Engine

REPO = "ddctl-vm"
PREBUILT_ENV = "DDCTL_DOCKER_IMAGE"
PREBUILT_PYTHON = "/opt/venv/bin/python"

SSHD_CONFIG = """\
# ddctl VM: key-only root login (the run's own key), no PAM, SFTP for the deploy.
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile /root/.ssh/authorized_keys
Subsystem sftp /usr/lib/openssh/sftp-server
PidFile none
"""

PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\nnogroup:x:65534:\n"
DIRS = {"etc/ssh": 0o755, "run/sshd": 0o755, "root": 0o700, "root/.ssh": 0o700, "tmp": 0o1777, "opt/ddctl": 0o755}
MOUNT_POINTS = ("proc", "sys", "dev", "usr", "var/empty")
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True, slots=True)
class VmImage:
    ref: str
    binds: tuple[str, ...]
    """``host:container:ro`` mounts of the host runtime (empty for a prebuilt image)."""
    python: str
    """The interpreter the agents run with, inside the VM."""


def _runtime_dirs() -> list[str]:
    """Host directories the VM mounts read-only: /usr, non-merged top-level dirs, the Python prefixes."""
    dirs = ["/usr"]
    dirs += [f"/{name}" for name in TOP_LEVEL if Path(f"/{name}").is_dir() and not Path(f"/{name}").is_symlink()]
    for prefix in (sys.base_prefix, sys.prefix):
        real = os.path.realpath(prefix)
        if not any(real == d or real.startswith(d + "/") for d in dirs):
            dirs.append(real)
    return dirs


def rootfs_tar() -> bytes:
    """The image's only layer: deterministic (fixed mtimes), so equal hosts give equal tags."""
    out = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, kind: bytes, mode: int, content: bytes = b"", target: str = "") -> None:
            if name in seen:
                return
            seen.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, 0, target
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content else None)

        for name, mode in sorted({**{d: 0o755 for d in MOUNT_POINTS}, **DIRS}.items()):
            add(name, tarfile.DIRTYPE, mode)
        for name in TOP_LEVEL:
            host = Path(f"/{name}")
            if host.is_symlink():
                add(name, tarfile.SYMTYPE, 0o777, target=os.readlink(host))
            elif host.is_dir():
                add(name, tarfile.DIRTYPE, 0o755)
        add("etc/passwd", tarfile.REGTYPE, 0o644, PASSWD.encode())
        add("etc/group", tarfile.REGTYPE, 0o644, GROUP.encode())
        add("etc/ssh/sshd_config", tarfile.REGTYPE, 0o644, SSHD_CONFIG.encode())
        if Path("/etc/ld.so.cache").exists():
            add("etc/ld.so.cache", tarfile.REGTYPE, 0o644, Path("/etc/ld.so.cache").read_bytes())
        for d in _runtime_dirs():  # mount points for the runtime, at the host's paths
            parts = Path(d).relative_to("/").parts
            for i in range(1, len(parts) + 1):
                add("/".join(parts[:i]), tarfile.DIRTYPE, 0o755)
    return out.getvalue()


def ensure_image(engine: Engine) -> VmImage:
    """The VM image, imported once per distinct host runtime (or the prebuilt one named by DDCTL_DOCKER_IMAGE)."""
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt:
        return VmImage(prebuilt, (), PREBUILT_PYTHON)
    layer = rootfs_tar()
    tag = hashlib.sha256(layer + "\n".join(_runtime_dirs()).encode()).hexdigest()[:12]
    ref = f"{REPO}:{tag}"
    if not engine.image_exists(ref):
        engine.import_image(layer, REPO, tag)
    return VmImage(ref, tuple(f"{d}:{d}:ro" for d in _runtime_dirs()), sys.executable)
