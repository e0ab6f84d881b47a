"""The offline VM image: one tiny deterministic layer, with the host runtime mounted read-only."""

from __future__ import annotations

import io
import os
import sys
import tarfile
from pathlib import Path

from ddctl.providers.docker import image as vm_image


def _members() -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(vm_image.rootfs_tar())) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_layer_is_deterministic_and_holds_what_sshd_needs() -> None:
    assert vm_image.rootfs_tar() == vm_image.rootfs_tar()  # equal hosts give equal tags
    members = _members()
    for name in ("etc/passwd", "etc/group", "etc/ssh/sshd_config", "run/sshd", "root/.ssh", "opt/ddctl", "usr"):
        assert name in members, name
    assert members["root/.ssh"].mode == 0o700 and members["tmp"].mode == 0o1777
    assert len(members) == len(set(members))
    with tarfile.open(fileobj=io.BytesIO(vm_image.rootfs_tar())) as tar:
        config = tar.extractfile("etc/ssh/sshd_config").read().decode()  # type: ignore[union-attr]
    assert "PasswordAuthentication no" in config and "PermitRootLogin prohibit-password" in config


def test_merged_usr_links_mirror_the_host_and_the_python_runtime_is_mounted() -> None:
    members = _members()
    for name in ("bin", "sbin", "lib"):
        host = Path(f"/{name}")
        if host.is_symlink():
            assert members[name].issym() and members[name].linkname == os.readlink(host)
    image = vm_image.VmImage("x", tuple(f"{d}:{d}:ro" for d in vm_image._runtime_dirs()), sys.executable)
    mounted = [b.split(":")[0] for b in image.binds]
    assert "/usr" in mounted and all(b.endswith(":ro") for b in image.binds)
    for prefix in (sys.base_prefix, sys.prefix):
        real = os.path.realpath(prefix)
        assert any(real == d or real.startswith(d + "/") for d in mounted), prefix
        assert real.lstrip("/").split("/")[0] in members  # its mount point exists in the layer
