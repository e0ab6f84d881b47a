"""What each instance of a run runs, and where: its spec, from the RegionInfo its provider gave.

One code path for every provider: a region whose machines are their own
(``RegionInfo.remote``) gets its files copied in and names them by their remote
paths (``deploy.REMOTE_ROOT``); a local one names this machine's files and runs
inside the region's command prefix (its shaped namespace). Learners reach the
syncer at their region's ``syncer_host``.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import replace

from ddctl.config.regions import Checkpoints, Region
from ddctl.control.credentials import relay_key_for, relay_tls, relay_token_for, token_for, write_private
from ddctl.control.plan import node_name
from ddctl.control.rundir import RunDir
from ddctl.errors import DdctlError
from ddctl.providers.base import LOOPBACK, InstanceSpec, RegionInfo
from ddctl.providers.deploy import REMOTE_ROOT
from ddctl_agents import storage
from ddctl_agents.relay import host_port
from ddctl_agents.relay import identity as relay_identity
from ddctl_agents.train.modelfiles import MODEL_DIR, pack

SYNCER_FILES = ("job.json", "secret", "tls/ca.pem", "tls/server.pem", "tls/server.key")
"""What a remote syncer needs of the job directory (never the CA's private key)."""
DEAD_MAN_S = 120.0
"""A learner that cannot reach the syncer this long exits (its machine powers off and is replaced)."""
EVAL_EVERY_S = 30.0
SHARD_MAP = "shards.json"
"""A sharded run's starting shard map, in its job directory."""
SHARD_LINGER_S = 600.0
"""A finished shard answers this long: the controller joins the shards' final checkpoint meanwhile, then removes them."""
RENDEZVOUS_PORT = 29400
"""torchrun's usual c10d port, on the first VM of a learner over several (its region's VMs may reach each other)."""
RELAY_PORT = 29401
"""A region's relay's port on the VM of the learner that hosts it (``agent/relay_host.py``)."""


def syncer_port(info: RegionInfo) -> int:
    """The port the syncer listens on: the region's fixed one, or a free port of this machine."""
    if info.syncer_port:
        return info.syncer_port
    with socket.socket() as probe:
        probe.bind((info.syncer_bind, 0))
        return int(probe.getsockname()[1])


def syncer_spec(
    run: str,
    info: RegionInfo,
    port: int,
    region: Region | None = None,
    checkpoints: Checkpoints | None = None,
    shard: tuple[str, str] = ("syncer", ""),
) -> InstanceSpec:
    """The synchronizer service of ``run`` in the region ``info`` describes, on ``port``; it checkpoints as
    ``checkpoints`` says (object storage under ``URL/RUN``) and starts from the run's resume checkpoint if it has one.

    ``shard``: (instance name, shard name) of one shard of a sharded synchronizer (a local process, or a VM with an
    address of its own: ``RegionInfo.shard_addresses`` on Docker, ``shard_hosts`` on a cloud), which serves the job's
    ``shards.json`` with a state directory of its own and lingers after the end until the controller has
    joined the shards' final global checkpoint (``control/shard_end.py``)."""
    rundir = RunDir(run)
    name, shard_name = shard
    if shard_name and info.remote and not (info.shard_addresses or info.shard_hosts):
        raise DdctlError(f"{name}: a shard on a cloud VM ({info.provider}) needs an address of its own, and bootstrap "
                         f"reserved none in {info.region}")  # fmt: skip
    job = f"{REMOTE_ROOT}/job" if info.remote else str(rundir.job)
    state_dir = f"{REMOTE_ROOT}/state" if info.remote else str(rundir.state(shard_name))
    state = ("--state-dir", state_dir) if info.remote or shard_name else ()
    argv = (info.python, "-m", "ddctl_agents.service", "--job-dir", job, *state, "--bind", f"{info.syncer_bind}:{port}")
    argv += ("--site", info.region)  # its own region's learners never cross its site's link
    argv += ("--shard-map", f"{job}/{SHARD_MAP}", "--shard", shard_name, "--linger", f"{SHARD_LINGER_S:g}") if shard_name else ()
    policy = checkpoints or Checkpoints()
    if not shard_name:  # a shard checkpoints its part only as part of a global checkpoint (``ddctl syncer checkpoint``)
        argv += ("--checkpoint-every-rounds", str(policy.every_rounds), "--checkpoint-every", f"{policy.every_minutes * 60:g}")
        argv += ("--keep-last", str(policy.keep_last), "--keep-every", str(policy.keep_every))
        argv += ("--checkpoint-url", storage.join(policy.url, run)) if policy.url else ()
    else:  # a shard whose state is gone starts from the controller's newest global checkpoint there (``resume.py``)
        argv += ("--resume-url", storage.join(policy.url, run)) if policy.url else ()
    resume = sorted(p.name for p in rundir.resume.iterdir()) if rundir.resume.is_dir() else []
    argv += ("--resume-from", f"{job}/resume") if resume else ()
    names = [
        *SYNCER_FILES,
        *([SHARD_MAP] if shard_name else []),
        *(f"resume/{name}" for name in resume),
        *(f"{MODEL_DIR}/{n}" for n in sorted(pack(rundir.job / MODEL_DIR))),
    ]
    return InstanceSpec(
        run=run,
        name=name,
        region=info.region,
        role="syncer",
        argv=(*argv, "--eval-every", f"{0 if shard_name else EVAL_EVERY_S:g}"),  # a shard holds part of the model
        log=rundir.log(name),
        files={f"{job}/{name}": str(rundir.job / name) for name in names} if info.remote else {},
        disks={f"{REMOTE_ROOT}/state": str(rundir.disk(shard_name))} if info.remote else {},
        summary=f"{state_dir}/summary.json",
        cloud_region=region.cloud_region if region is not None else "",
        zone=region.zones[0] if region is not None and region.zones else "",
        machine=dict(info.machine),
    )


def rendezvous_port(info: RegionInfo) -> int:
    """Where a learner's first VM hosts torchrun's rendezvous: the usual port on a machine of its own, else a free one."""
    return RENDEZVOUS_PORT if info.remote else _free_port()


def relay_port(info: RegionInfo) -> int:
    """Where a region's relay listens on its host learner's machine: a fixed port on a VM, else a free one."""
    return RELAY_PORT if info.remote else _free_port()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def with_relay(spec: InstanceSpec, host: str) -> InstanceSpec:
    """A relayed learner's spec pointed at its region's relay, on the machine of the learner that hosts it, at ``host``
    (its private address); without one (that learner is not running) at no host (``https://:PORT``): its versions
    come from the shards, which it asks where the relay is until one knows (``agent/subscription.py``). The host
    itself keeps reaching its relay on loopback."""
    argv = list(spec.argv)
    if "--relay" not in argv or "--host-relay" in argv:
        return spec
    at = argv.index("--relay")
    port = argv[at + 1].rpartition(":")[2]
    argv[at + 1] = f"https://{host_port(host, port)}"
    return replace(spec, argv=tuple(argv))


def with_rendezvous(spec: InstanceSpec, host: str) -> InstanceSpec:
    """A node's spec pointed at the address its learner's node 0 came up at (known once that VM exists)."""
    argv = list(spec.argv)
    if "--rendezvous" not in argv:
        return spec
    if not host:
        raise DdctlError(f"{spec.name}: its learner's node 0 came up without a private address; its nodes cannot meet")
    at = argv.index("--rendezvous") + 1
    argv[at] = f"{host}:{argv[at].rpartition(':')[2]}"
    return replace(spec, argv=tuple(argv))


def learner_spec(
    run: str,
    info: RegionInfo,
    region: Region,
    learner: str,
    ports: tuple[int, ...],
    node: int = 0,
    meet: int = 0,
    cadence: int = 1,
    relay: tuple[str, int] = ("", 0),
) -> InstanceSpec:
    """Node ``node`` of a learner of ``region``, reaching the syncer at its region's address (each shard of a sharded
    one at ``RegionInfo.shard_host``, on its port of ``ports``: it routes each fragment to its owner), sending each
    fragment every ``cadence`` periods (the plan's).

    ``relay``: ("host", port) for the learner that runs its region's relay on ``port``, ("served", port) for another
    learner of that region, which reaches it on loopback until the host's address is known (``with_relay``).

    Over several VMs (``region.nodes``) every node runs the same command with ``--nodes`` and meets at
    node 0's rendezvous on port ``meet``: loopback until node 0 exists (``with_rendezvous``), which is
    right for node 0 itself (it hosts it) and for local processes (they share this machine)."""
    rundir = RunDir(run)
    name = node_name(learner, node)
    token = rundir.token(learner)
    token.parent.mkdir(parents=True, exist_ok=True)
    token.touch(mode=0o600)
    token.write_text(token_for(rundir.job, learner))
    if info.remote:
        token_path, ca, summary = f"{REMOTE_ROOT}/token", f"{REMOTE_ROOT}/ca.pem", f"{REMOTE_ROOT}/summary.json"
        files = {token_path: str(token), ca: str(rundir.ca)}
    else:
        token_path, ca, summary, files = str(token), str(rundir.ca), str(rundir.summary(name)), {}
    argv = (
        *info.command_prefix,
        info.python,
        "-m",
        "ddctl_agents.agent",
        *(arg for i, port in enumerate(ports) for arg in ("--syncer", f"https://{info.shard_host(i)}:{port}")),
        *("--name", learner, "--region", region.name),
        *("--token-file", token_path, "--ca", ca, "--syncer-timeout", f"{DEAD_MAN_S:g}", "--summary", summary),
        *(("--notice-url", info.notice_url) if info.notice_url else ()),
        *(("--cadence", str(cadence)) if cadence > 1 else ()),
        *(("--gpus", str(region.ranks)) if region.ranks > 1 else ()),  # one learner over N ranks (torchrun)
        *(("--nodes", str(region.nodes), "--rendezvous", f"{LOOPBACK}:{meet}") if region.nodes > 1 else ()),
    )
    if relay[0] and node == 0:
        argv, files = _relayed(rundir, info, region.name, learner, relay, argv, files)
    link = (region.link.up_mbps, region.link.down_mbps) if region.link is not None else None
    return InstanceSpec(
        run=run,
        name=name,
        region=region.name,
        role="learner",
        argv=argv,
        log=rundir.log(name),
        files=files,
        link=link,
        summary=summary,
        cloud_region=region.cloud_region,
        zone=region.zones[0] if region.zones else "",
        machine=dict(info.machine),
    )


def _relayed(
    rundir: RunDir,
    info: RegionInfo,
    region: str,
    learner: str,
    relay: tuple[str, int],
    argv: tuple[str, ...],
    files: dict[str, str],
) -> tuple[tuple[str, ...], dict[str, str]]:
    """A learner's argv and files with its relay token and, on the relay's host, the relay's own files (its token for
    the shards, the region's key, its certificate; ``relay_host.HOST_FILES``)."""
    role, port = relay
    token = write_private(rundir.relay_token(learner), relay_token_for(rundir.job, region, learner))
    remote = f"{REMOTE_ROOT}/relay" if info.remote else ""
    argv += ("--relay", f"https://{LOOPBACK}:{port}", "--relay-token-file", f"{remote}.token" if remote else str(token))
    files = {**files, f"{remote}.token": str(token)} if remote else files
    if role == "host":
        folder = rundir.relay_files(region)
        cert, key = relay_tls(rundir.job, region)
        made = {
            "token": write_private(folder / "token", token_for(rundir.job, relay_identity(region))),
            "key": write_private(folder / "key", relay_key_for(rundir.job, region).hex()),
            "tls.pem": write_private(folder / "tls.pem", cert.read_text().strip()),
            "tls.key": write_private(folder / "tls.key", key.read_text().strip()),
        }
        argv += ("--host-relay", f"{'0.0.0.0' if info.remote else LOOPBACK}:{port}", "--host-relay-dir", remote or str(folder))
        files = {**files, **{f"{remote}/{n}": str(path) for n, path in made.items()}} if remote else files
    return argv, files


def helper_spec(run: str, name: str, region: str, module: str, *args: str) -> InstanceSpec:
    """A control-plane process on this machine (the controller)."""
    return InstanceSpec(
        run=run,
        name=name,
        region=region,
        role=name,
        argv=(sys.executable, "-m", module, "--run", run, *args),
        log=RunDir(run).log(name),
    )
