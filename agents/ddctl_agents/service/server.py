"""Run the synchronizer service: ``python -m ddctl_agents.service --job-dir DIR``.

A job directory holds ``job.json`` (the run id and the JobConfig), ``secret``
(hex), ``model/`` when the job trains a model of its own (``train/modelfiles.py``)
and, for TLS, ``tls/server.pem`` + ``tls/server.key`` signed by the job's
own CA (``tls/ca.pem``, which learners pin). Without TLS files the service
speaks h2c (HTTP/2 prior knowledge), and only on a loopback address.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import json
import re
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from hypercorn.asyncio import serve
from hypercorn.config import Config

from ddctl_agents.core import shardmap
from ddctl_agents.core.shardmap import ShardRole
from ddctl_agents.entrypoint import Parser, add_label_option, configure_logging, report
from ddctl_agents.errors import AgentError, ConfigError
from ddctl_agents.jsonable import from_json
from ddctl_agents.service import h2tuning
from ddctl_agents.service.app import SyncerApp
from ddctl_agents.service.auth import read_secret
from ddctl_agents.service.checkpoints import checkpoint_policy
from ddctl_agents.service.resume import starting_point
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.modelfiles import MODEL_DIR


@dataclass(frozen=True, slots=True)
class JobFiles:
    run: str
    job: JobConfig
    secret: bytes
    cert: Path | None
    key: Path | None
    model_dir: Path | None = None
    """The shipped source of the job's own model, imported from here and served to learners with the job."""


def load_job_dir(job_dir: Path) -> JobFiles:
    """Read and validate a job directory; errors name the file and what is wrong."""
    job_file = job_dir / "job.json"
    try:
        raw = json.loads(job_file.read_text())
    except OSError as exc:
        raise ConfigError(f"{job_file}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{job_file}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("run"), str) or "job" not in raw:
        raise ConfigError(f"{job_file}: must be an object with 'run' (string) and 'job' (JobConfig)")
    try:
        job = from_json(JobConfig, raw["job"])
        secret = read_secret((job_dir / "secret").read_text())
    except OSError as exc:
        raise ConfigError(f"{job_dir / 'secret'}: cannot read ({exc.strerror})") from None
    except AgentError as exc:
        raise ConfigError(f"{job_dir}: {exc}") from None
    cert, key = job_dir / "tls" / "server.pem", job_dir / "tls" / "server.key"
    has_tls = cert.exists() and key.exists()
    model_dir = job_dir / MODEL_DIR if (job_dir / MODEL_DIR).is_dir() else None
    return JobFiles(
        run=raw["run"], job=job, secret=secret, cert=cert if has_tls else None, key=key if has_tls else None, model_dir=model_dir
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(bind: str) -> socket.socket:
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--bind must be HOST:PORT, got {bind!r}")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), int(port)))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {bind}: {exc.strerror}") from None
    sock.listen(256)
    sock.set_inheritable(True)
    return sock


def hypercorn_config(sock: socket.socket, cert: Path | None, key: Path | None, plaintext: bool) -> Config:
    """HTTP/2 on ``sock``: h2 over TLS with ``cert`` and ``key`` (ALPN), or h2c with ``plaintext``."""
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    config.h2_max_concurrent_streams = 256
    config.keep_alive_timeout = 120
    config.graceful_timeout = 5
    if not plaintext:
        if cert is None or key is None:
            raise ConfigError("TLS needs tls/server.pem and tls/server.key in the job directory (ddctl syncer init makes them)")
        config.certfile, config.keyfile = str(cert), str(key)
        config.alpn_protocols = ["h2", "http/1.1"]
    return config


async def run_service(
    files: JobFiles, settings: ServiceSettings, sock: socket.socket, plaintext: bool, stop: asyncio.Event | None = None
) -> None:
    h2tuning.install()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    assembly = await loop.run_in_executor(None, functools.partial(Assembly.build, files.job, model_dir=files.model_dir))
    runtime = SyncerRuntime(assembly, settings)
    app = SyncerApp(runtime, files.secret)

    async def until_stopped() -> None:
        """SIGTERM, or the job finished and its summary has lingered: the service leaves (exit 0)."""
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(runtime.ended.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()

    await serve(app, hypercorn_config(sock, files.cert, files.key, plaintext), shutdown_trigger=until_stopped)  # type: ignore[arg-type]


def shard_role(args: argparse.Namespace, files: JobFiles) -> ShardRole | None:
    """``--shard-map`` and ``--shard`` together, checked against the job; what a shard cannot do alone is refused."""
    if not args.shard_map and not args.shard:
        return None
    if not args.shard_map or not args.shard:
        raise ConfigError("--shard-map and --shard go together: the map of the job's shards and this process's name in it")
    try:
        raw = json.loads(args.shard_map.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the shard map {args.shard_map}: {exc}") from None
    try:
        role = ShardRole(name=args.shard, map=shardmap.parse(raw))
        role.map.check_fragments(files.job.sync.fragments)
    except ConfigError as exc:
        raise ConfigError(f"{args.shard_map}: {exc}") from None
    # a shard may start from a whole checkpoint (``--resume-from``: it serves its fragments of it), not evaluate or write one
    whole_model = {"--eval-every": args.eval_every, "--checkpoint-every-rounds": args.checkpoint_every_rounds,
                   "--checkpoint-every": args.checkpoint_every}  # fmt: skip
    for flag, value in whole_model.items():
        if value:
            raise ConfigError(f"{flag} needs the whole model, and a shard holds only its fragments; drop it with --shard")
    return role


def site_name(raw: str) -> str:
    """``--site``: a region's name as learners give theirs (``requests.Region``)."""
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{0,64}", raw):
        raise ConfigError(f"--site must be a region name of up to 64 letters, digits and _.:-, got {raw!r:.80}")
    return raw


def main(argv: list[str] | None = None) -> int:
    defaults = ServiceSettings(state_dir=Path())
    parser = Parser("ddctl syncer serve", "Run the Decoupled DiLoCo synchronizer service.")
    parser.add_argument("--job-dir", type=Path, required=True, help="The job directory: job.json, secret, tls/ (syncer init).")
    parser.add_argument("--state-dir", type=Path, help="Snapshots, write-ahead log and tape (default: JOB_DIR/state).")
    parser.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT to listen on; port 0 picks a free one.")
    parser.add_argument("--port-file", type=Path, help="Write the bound port here once listening.")
    parser.add_argument("--plaintext", action="store_true", help="Serve h2c without TLS (on loopback only).")
    parser.add_argument("--snapshot-every", type=float, default=defaults.snapshot_every_s, help="Seconds between snapshots.")
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=defaults.heartbeat_timeout_s,
        help="Seconds of silence after which a learner is declared gone.",
    )
    parser.add_argument("--eval-every", type=float, default=defaults.eval_every_s, help="Seconds between evaluations (0: never).")
    parser.add_argument(
        "--linger", type=float, default=defaults.linger_s, help="Seconds a finished job's syncer keeps answering, then exits."
    )
    parser.add_argument(
        "--finish-timeout",
        type=float,
        default=defaults.finish_timeout_s,
        help="Seconds a finishing job waits for its learners to leave.",
    )
    add_label_option(parser)
    parser.add_argument(
        "--max-update-bytes",
        type=int,
        default=defaults.max_update_bytes,
        help="Refuse larger updates with 413 (0: from the model's size).",
    )
    policy = defaults.checkpoints
    parser.add_argument(
        "--checkpoint-every-rounds", type=int, default=policy.every_rounds, help="Checkpoint after this many rounds (0: not)."
    )
    parser.add_argument(
        "--checkpoint-every",
        type=float,
        help=f"Checkpoint after this many seconds (0: not; default {policy.every_s:g}, and off on a shard).",
    )
    parser.add_argument("--keep-last", type=int, default=policy.keep_last, help="Keep this many newest checkpoints.")
    parser.add_argument("--keep-every", type=int, default=policy.keep_every, help="Also keep every Nth checkpoint (0: none).")
    parser.add_argument("--checkpoint-url", default="", help="Also write checkpoints here: s3://B/P, gs://B/P or a directory.")
    parser.add_argument("--resume-from", type=Path, help="A checkpoint directory a fresh state directory starts from.")
    parser.add_argument("--resume-url", default="", help="Where a new state directory looks for the run's newest checkpoint "
                        "to start from (default: --checkpoint-url; a shard's are the controller's global ones).")  # fmt: skip
    parser.add_argument("--shard-map", type=Path, help="Serve one shard of a sharded synchronizer: the shard map (JSON).")
    parser.add_argument("--shard", default="", help="This process's shard in --shard-map (S0, S1, ...).")
    parser.add_argument("--site", default="", help="The region this process runs in (its learners' transfers stay inside).")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        files = load_job_dir(args.job_dir)
        host = args.bind.rpartition(":")[0].strip("[]")
        if args.plaintext and not is_loopback(host):
            raise ConfigError(f"plaintext is refused on {host}: it is not a loopback address; drop --plaintext to use TLS")
        for name, value in (("--snapshot-every", args.snapshot_every), ("--heartbeat-timeout", args.heartbeat_timeout)):
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        for name, value in (("--linger", args.linger), ("--finish-timeout", args.finish_timeout)):
            if not value >= 0:
                raise ConfigError(f"{name} must be >= 0 seconds, got {value}")
        shard = shard_role(args, files)
        every_s = args.checkpoint_every if args.checkpoint_every is not None else 0.0 if shard else policy.every_s
        checkpoints = checkpoint_policy(
            args.checkpoint_every_rounds, every_s, args.keep_last, args.keep_every, args.checkpoint_url
        )
        state_dir = args.state_dir or args.job_dir / "state"
        settings = ServiceSettings(
            state_dir=state_dir,
            run=files.run,
            snapshot_every_s=args.snapshot_every,
            heartbeat_timeout_s=args.heartbeat_timeout,
            eval_every_s=args.eval_every,
            max_update_bytes=args.max_update_bytes,
            linger_s=args.linger,
            finish_timeout_s=args.finish_timeout,
            checkpoints=checkpoints,
            resume_from=starting_point(state_dir, args.resume_url or checkpoints.url, args.resume_from, files.run, files.job),
            shard=shard,
            site=site_name(args.site),
        )
        sock = bind_socket(args.bind)
    except AgentError as exc:
        return report(parser.prog, exc)
    port = sock.getsockname()[1]
    if args.port_file:
        args.port_file.write_text(f"{port}\n")
    print(
        f"syncer {files.run} listening on {args.bind.rpartition(':')[0]}:{port} ({'h2c' if args.plaintext else 'h2+TLS'})",
        flush=True,
    )
    asyncio.run(run_service(files, settings, sock, args.plaintext))
    return 0
