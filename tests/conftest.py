"""Suite-wide settings: property tests are derandomized in CI so a run is reproducible."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from aws_cloud import AwsCloud
    from gcp_cloud import GcpCloud

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure() -> None:
    """Let Ctrl-C reach the CLIs the tests interrupt, as a terminal delivers it.

    A shell starts a background job (``pytest &``) with SIGINT ignored, and every process it starts inherits that:
    an interrupted ``up`` ran on to its end and ``logs --follow`` followed on. A handled signal is reset to its
    default across exec, so with the handler back here each child starts with Python's own KeyboardInterrupt.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def aws_cloud() -> Iterator[AwsCloud]:
    """One moto server with its fault layer for the whole session (moto's backends are process-wide anyway)."""
    from aws_cloud import AwsCloud

    with AwsCloud() as cloud:
        yield cloud


@pytest.fixture
def aws(aws_cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AwsCloud:
    """A wiped cloud that this process's boto3 (and any process it starts) talks to; SSH allowed from the bridge."""
    aws_cloud.reset()
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL_")]:
        monkeypatch.delenv(name)
    for name, value in aws_cloud.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DDCTL_SSH_FROM", "100.100.0.1/32")
    return aws_cloud


@pytest.fixture(scope="session")
def gcp_cloud() -> Iterator[GcpCloud]:
    """One fake Compute Engine API for the whole session (its preemptions give 3 s of notice, not GCE's 30)."""
    from gcp_cloud import GcpCloud

    with GcpCloud(preempt_notice_s=3.0) as cloud:
        yield cloud


@pytest.fixture
def gcp(gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> GcpCloud:
    """A wiped fake that this process's google-cloud-compute (and any process it starts) talks to, anonymously."""
    gcp_cloud.reset()
    for name, value in gcp_cloud.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DDCTL_SSH_FROM", "100.100.0.1/32")
    return gcp_cloud


@pytest.fixture
def native_kernels() -> None:
    """Fail, not skip, without the native kernels: setup.py builds them on every supported machine."""
    from ddctl_agents.core import _native

    if _native.kernels() is None:
        pytest.fail(f"native kernels unavailable: {_native.missing_reason()}; build them with `pip install -e .`")
