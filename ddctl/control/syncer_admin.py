"""Operator actions on a running syncer with the admin identity: ``ddctl syncer readmit``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddctl.control.credentials import token_for
from ddctl.control.runs import choose_run
from ddctl.control.state import State
from ddctl.control.up import admin_client
from ddctl.errors import DdctlError, UnreachableError
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.agent.routes import syncer_url


def readmit(learner: str, *, run: str = "", url: str = "", job_dir: Path | None = None) -> dict[str, Any]:
    """Readmit ``learner`` on a run's syncer, or on the syncer at ``url`` whose job directory is ``job_dir``."""
    client = _client(run, url, job_dir)
    try:
        return client.readmit(learner)
    except Unavailable as exc:
        raise UnreachableError(f"the syncer could not be reached: {exc}") from None
    finally:
        client.close()


def _client(run: str, url: str, job_dir: Path | None) -> SyncerClient:
    if bool(url) != (job_dir is not None):
        raise DdctlError("give --url and --job-dir together (a syncer ddctl up did not start), or neither (a run's syncer)")
    if job_dir is not None:
        try:
            url = syncer_url(url)
        except ValueError as exc:
            raise DdctlError(f"--url: {exc}") from None
        ca = job_dir / "tls" / "ca.pem"
        return SyncerClient(url, token_for(job_dir, "admin"), ca if url.startswith("https://") else None)
    with State() as state:
        chosen = choose_run(state, run)
    try:
        return admin_client(chosen)
    except OSError as exc:
        raise DdctlError(f"run {chosen} has no syncer address yet ({exc}); is it up?") from None
