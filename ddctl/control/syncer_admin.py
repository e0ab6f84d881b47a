"""Operator actions on a running syncer with the admin identity: ``ddctl syncer readmit``, and how every ``ddctl
syncer`` command reaches a job's shards as admin."""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


def checked_urls(urls: Iterable[str], option: str) -> list[str]:
    """Every address normalised, checked before any is dialled: a bad one is named with ``option`` and what an
    address may be, not met at the first request as a traceback or "unreachable"."""
    checked = []
    for url in urls:
        try:
            checked.append(syncer_url(url))
        except ValueError as exc:
            raise DdctlError(f"{option}: {exc}") from None
    return checked


def admin_connector(job_dir: Path) -> Callable[[str], SyncerClient]:
    """How to reach any shard of the job in ``job_dir`` as admin: the job's admin token, and its CA for https."""
    token, ca = token_for(job_dir, "admin"), job_dir / "tls" / "ca.pem"
    return lambda url: SyncerClient(url, token, ca if url.startswith("https://") else None)


def _client(run: str, url: str, job_dir: Path | None) -> SyncerClient:
    if bool(url) != (job_dir is not None):
        raise DdctlError("give --url and --job-dir together (a syncer ddctl up did not start), or neither (a run's syncer)")
    if job_dir is not None:
        (url,) = checked_urls([url], "--url")
        return admin_connector(job_dir)(url)
    with State() as state:
        chosen = choose_run(state, run)
    try:
        return admin_client(chosen)
    except OSError as exc:
        raise DdctlError(f"run {chosen} has no syncer address yet ({exc}); is it up?") from None
