"""Run a region's relay: ``ddctl syncer relay`` (``python -m ddctl_agents.relay``) ``--syncer URL ... --region R --key-file F``.

The relay runs on one of the region's machines. It reaches the shards as
``relay-REGION`` (a token the job's secret signs, ``--token``) and serves the
region's learners, who show tokens made from the region's key (``--key-file``,
hex, ``auth.relay_key``). TLS with ``--tls-cert``/``--tls-key`` (signed by the
job's CA, which learners pin); ``--plaintext`` serves h2c on loopback only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

from hypercorn.asyncio import serve

from ddctl_agents import relay
from ddctl_agents.agent.client import SyncerClient, retry
from ddctl_agents.agent.routes import syncer_url_arg
from ddctl_agents.entrypoint import Parser, add_label_option, configure_logging, report
from ddctl_agents.errors import AgentError, ConfigError
from ddctl_agents.jsonable import from_json
from ddctl_agents.relay.app import RelayApp
from ddctl_agents.relay.feed import Feed
from ddctl_agents.service import h2tuning
from ddctl_agents.service.auth import check_identity, read_secret
from ddctl_agents.service.publisher import Publisher
from ddctl_agents.service.server import bind_socket, hypercorn_config, is_loopback
from ddctl_agents.train.job import JobConfig

STREAMS_END_S = 0.5
"""How long a stopping relay gives its ended streams to reach their learners before the server closes."""
STALE_AFTER_S = 15.0
"""Three of the synchronizer's 5 s keep-alives missed: the relay stops serving until it hears again."""


def job_fragments(client: SyncerClient) -> int:
    """How many fragments the job has, from the synchronizer's job (checked as any peer's answer)."""
    answer = retry(client.job, give_up_after_s=120.0)
    try:
        return int(from_json(JobConfig, answer["job"]).sync.fragments)
    except (KeyError, TypeError, AgentError) as exc:
        raise ConfigError(f"the synchronizer's job cannot be read: {exc}") from None


async def run_relay(app: RelayApp, sock: socket.socket, cert: Path | None, key: Path | None, plaintext: bool) -> None:
    h2tuning.install()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)

    async def until_stopped() -> None:
        """SIGTERM: the learners' streams end first (each learner turns to the shards), then the server; hypercorn
        shutting down under open streams logged tracebacks and left the relay's exit to a crash."""
        await stop.wait()
        await app.feed.publisher.close()
        await asyncio.sleep(STREAMS_END_S)

    await serve(app, hypercorn_config(sock, cert, key, plaintext), shutdown_trigger=until_stopped)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = Parser("ddctl syncer relay", "Pull each fragment version into this region once and serve it to its learners.")
    shard = "A shard's URL (once per shard), as learners give it."
    parser.add_argument("--syncer", required=True, action="append", type=syncer_url_arg, help=shard)
    parser.add_argument("--region", required=True, help="The region this relay serves (its learners' tokens are for it).")
    parser.add_argument("--token", help="The relay's token for the shards, for identity relay-REGION (or DDCTL_TOKEN).")
    parser.add_argument("--token-file", type=Path, help="A file holding the relay's token for the shards.")
    parser.add_argument("--key-file", type=Path, required=True, help="The region's relay key (hex): it checks learners' tokens.")
    parser.add_argument("--ca", type=Path, help="The job's CA certificate to pin (https shards).")
    parser.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT to listen on; port 0 picks a free one.")
    parser.add_argument("--port-file", type=Path, help="Write the bound port here once listening.")
    parser.add_argument("--advertise", default="", metavar="HOST:PORT",
                        help="Where the region's learners reach this relay, told to the shards so a learner whose relay "
                             "moved finds it (default: the bind address, or for 0.0.0.0 this machine's address on its "
                             "route to the first shard).")  # fmt: skip
    parser.add_argument("--tls-cert", type=Path, help="This relay's certificate (PEM), signed by the job's CA.")
    parser.add_argument("--tls-key", type=Path, help="The certificate's private key (PEM).")
    parser.add_argument("--plaintext", action="store_true", help="Serve h2c without TLS (on loopback only).")
    parser.add_argument("--stale-after", type=float, default=STALE_AFTER_S,
                        help="Seconds without a word from a shard after which learners are sent to the shards.")  # fmt: skip
    parser.add_argument("--keepalive", type=float, default=5.0, help="Seconds between keep-alives on a quiet stream.")
    add_label_option(parser)
    args = parser.parse_args(argv)
    configure_logging()
    try:
        region = check_identity(args.region)
        token = args.token or os.environ.get("DDCTL_TOKEN") or (args.token_file.read_text().strip() if args.token_file else "")
        if not token:
            raise ConfigError("give the relay's token with --token, --token-file or DDCTL_TOKEN")
        key = read_secret(args.key_file.read_text())
        for name, value in (("--stale-after", args.stale_after), ("--keepalive", args.keepalive)):
            if not 0 < value <= 3600:
                raise ConfigError(f"{name} must be in (0, 3600] seconds, got {value}")
        if args.keepalive >= args.stale_after:
            raise ConfigError(f"--keepalive ({args.keepalive:g} s) must be shorter than --stale-after ({args.stale_after:g} s)")
        host = args.bind.rpartition(":")[0].strip("[]")
        if args.plaintext and not is_loopback(host):
            raise ConfigError(f"plaintext is refused on {host}: it is not a loopback address; drop --plaintext to use TLS")
        if not args.plaintext and (args.tls_cert is None or args.tls_key is None):
            raise ConfigError("give --tls-cert and --tls-key (signed by the job's CA), or --plaintext on loopback")
        try:
            advertised = relay.address(args.advertise) if args.advertise else ""
        except ValueError as exc:
            raise ConfigError(f"--advertise {args.advertise}: {exc}") from None

        def connect(url: str) -> SyncerClient:
            return SyncerClient(url, token, args.ca)

        first = connect(args.syncer[0])
        try:
            fragments = job_fragments(first)
        finally:
            first.close()
        sock = bind_socket(args.bind)
        port = sock.getsockname()[1]
        try:
            at = advertised or relay.own_address(host, port, args.syncer[0])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        feed = Feed(args.syncer, connect, Publisher(fragments), fragments, args.stale_after, at=at)
        app = RelayApp(feed, key, region, args.keepalive)
    except OSError as exc:
        return report(parser.prog, ConfigError(f"cannot read {exc.filename}: {exc.strerror}"))
    except AgentError as exc:
        return report(parser.prog, exc)
    if args.port_file:
        args.port_file.write_text(f"{port}\n")
    print(f"relay {region} listening on {host}:{port} for {len(args.syncer)} shard(s), reached at {at}", flush=True)
    asyncio.run(run_relay(app, sock, args.tls_cert, args.tls_key, args.plaintext))
    return 0
