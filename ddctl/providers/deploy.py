"""Deploying agents over SSH (asyncssh): the one path for Docker "VMs" and cloud VMs alike.

Each run has its own ed25519 client key; each machine's host key is known in
advance (ddctl generates it and hands it to the machine, as cloud-init does), so
``known_hosts`` is pinned and a machine that answers with any other key is
refused. Deploying copies the agent bundle (the ``ddctl_agents`` package) and the
instance's files with SFTP, then starts the agent detached, with its output in
``/opt/ddctl/agent.log`` and its pid in ``agent.pid``; when the agent ends, an
``on_exit`` command runs (a Docker "VM" powers off, so the controller sees it).
"""

from __future__ import annotations

import asyncio
import io
import re
import shlex
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import BinaryIO, TypeVar

import asyncssh

import ddctl_agents
from ddctl.errors import DdctlError, DeployError
from ddctl_agents.waiting import await_until

REMOTE_ROOT = "/opt/ddctl"
BUNDLE = f"{REMOTE_ROOT}/bundle"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Target:
    """How to reach one machine: address, the pinned host key, and the run's client key."""

    host: str
    host_key: str
    """The machine's public host key, one OpenSSH line (``ssh-ed25519 AAAA...``)."""
    client_key: Path
    port: int = 22
    user: str = "root"


def pinnable(key: object) -> str | None:
    """``key`` if it is one ed25519 public key line, the only kind ddctl makes: a host key a cloud or the engine
    hands back becomes a ``known_hosts`` line, and one with a newline would pin a key of its own."""
    return key if isinstance(key, str) and re.fullmatch(r"ssh-ed25519 [A-Za-z0-9+/=]{40,200}( \S*)?", key) else None


def new_keypair() -> tuple[bytes, str]:
    """A fresh ed25519 key: (private key in OpenSSH format, public key line)."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key.export_private_key(), key.export_public_key().decode().strip()


def ensure_client_key(path: Path) -> str:
    """The run's client key at ``path`` (created, mode 0600, if missing); returns its public line."""
    if not path.exists():
        private, _public = new_keypair()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_bytes(private)
    return asyncssh.read_private_key(str(path)).export_public_key().decode().strip()


def known_hosts_line(target: Target) -> str:
    host = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
    return f"{host} {target.host_key}"


@cache
def build_bundle() -> bytes:
    """The agent bundle: ``ddctl_agents`` as a gzipped tar (sources and the compiled kernels, no caches)."""
    package = Path(ddctl_agents.__file__).parent
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(package, arcname="ddctl_agents", filter=lambda info: None if "__pycache__" in info.name else info)
    return out.getvalue()


async def _connect(target: Target, wait_s: float) -> asyncssh.SSHClientConnection:
    """Connect with the pinned host key, retrying while the machine's sshd comes up."""

    async def attempt() -> asyncssh.SSHClientConnection:
        try:
            return await asyncssh.connect(
                target.host,
                port=target.port,
                username=target.user,
                known_hosts=asyncssh.import_known_hosts(known_hosts_line(target)),
                client_keys=[str(target.client_key)],
                agent_path=None,
                connect_timeout=5,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise DeployError(f"{target.host}: host key does not match the pinned one ({exc}); refusing to deploy") from None

    def refused(message: str) -> DeployError:
        return DeployError(f"{target.host}:{target.port}: cannot connect over SSH ({message})", host=target.host)

    return await await_until(
        attempt, timeout_s=wait_s, what="sshd to accept the run's key", retry_on=(OSError, asyncssh.Error), error=refused
    )


def _sync(job: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(job())  # type: ignore[arg-type]


MIB = 1 << 20
SUMMARY_LIMIT = MIB
"""An exit summary or ``summary.json``: a few hundred bytes, a few KiB with a long roster. Also what a command the
controller runs (``run_command``) may print on each stream."""
LOG_LIMIT = 256 * MIB
"""An agent's log read whole (``ddctl logs``, a retired VM's log collected)."""
FILE_LIMIT = 1 << 30
"""Any other file read whole into memory: a tape, a checkpoint's file (its manifest's byte count is checked after)."""


class TooLarge(DdctlError):
    """A remote file or a command's output is larger than the caller reads: the machine's data is bad (or hostile),
    not unreachable."""


async def _read_within(stream: asyncssh.SSHReader[bytes], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``stream`` (one more tells output over ``limit``), whatever the machine sends."""
    data = bytearray()
    while len(data) <= limit and (chunk := await stream.read(1 << 16)):
        data += chunk
    return bytes(data)


async def _run(conn: asyncssh.SSHClientConnection, command: str, target: Target, limit: int) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one command; TooLarge, read no further, where a stream passes ``limit`` bytes.

    Both streams are read at once (a command that fills one while the other is read would wait for ever), and
    the first over its limit ends the read of both."""
    async with conn.create_process(command, encoding=None) as process:
        reads = [asyncio.ensure_future(_read_within(stream, limit)) for stream in (process.stdout, process.stderr)]
        for finished in asyncio.as_completed(reads):
            if len(await finished) > limit:
                for read in reads:
                    read.cancel()
                raise TooLarge(f"{target.host}: `{command}` printed more than the {limit} bytes it may; not read")
        done = await process.wait(check=False)
    out, err = (read.result().decode("utf-8", errors="replace") for read in reads)
    return int(done.exit_status or 0), out, err


async def _check(conn: asyncssh.SSHClientConnection, command: str, target: Target) -> str:
    status, out, err = await _run(conn, command, target, SUMMARY_LIMIT)
    if status != 0:
        raise DeployError(f"{target.host}: `{command}` exited {status}: {err.strip()}")
    return out


def deploy(
    target: Target,
    bundle: bytes,
    files: dict[str, bytes],
    argv: list[str],
    env: dict[str, str] | None = None,
    on_exit: str = "",
    wait_s: float = 30.0,
) -> int:
    """Copy the bundle and ``files`` ({remote path: content}), start ``argv`` detached; returns the agent's pid."""
    environment = {"PYTHONPATH": BUNDLE, **(env or {})}
    inner = (
        f"{' '.join(f'{k}={shlex.quote(v)}' for k, v in environment.items())} "
        f'"$0" "$@" >>{REMOTE_ROOT}/agent.log 2>&1 & echo $! >{REMOTE_ROOT}/agent.pid; '
        f"wait $!; echo $? >{REMOTE_ROOT}/agent.exit; {on_exit}"
    )
    launch = f"setsid -f sh -c {shlex.quote(inner)} {shlex.join(argv)} </dev/null >/dev/null 2>&1"

    async def job() -> int:
        conn = await _connect(target, wait_s)
        try:
            parents = sorted({str(Path(p).parent) for p in files} | {BUNDLE})
            await _check(conn, f"mkdir -p {shlex.join(parents)} && rm -f {REMOTE_ROOT}/agent.pid", target)
            async with conn.start_sftp_client() as sftp:
                async with sftp.open(f"{REMOTE_ROOT}/bundle.tar.gz", "wb") as remote:
                    await remote.write(bundle)
                for path, content in files.items():
                    async with sftp.open(path, "wb") as remote:
                        await remote.write(content)
                    await sftp.chmod(path, 0o600)
            await _check(conn, f"tar -xzf {REMOTE_ROOT}/bundle.tar.gz -C {BUNDLE}", target)
            await _check(conn, launch, target)

            async def pid() -> int:  # the pid file appears as soon as the agent is forked
                text = (await _run(conn, f"cat {REMOTE_ROOT}/agent.pid 2>/dev/null", target, SUMMARY_LIMIT))[1].strip()
                return int(text) if text.isdigit() else 0

            def missing(message: str) -> DeployError:
                return DeployError(f"{target.host}: the agent did not start ({message}); see {REMOTE_ROOT}/agent.log there")

            return await await_until(pid, timeout_s=5.0, every_s=0.02, what="the agent's pid file", error=missing)
        finally:
            conn.close()

    return _sync(job)


def run_command(target: Target, command: str, wait_s: float = 10.0, limit: int = SUMMARY_LIMIT) -> tuple[int, str, str]:
    """Run one command over SSH: (exit status, stdout, stderr); TooLarge where a stream passes ``limit`` bytes (the
    machine's answer is held in memory, so it is read no further than its caller needs)."""

    async def job() -> tuple[int, str, str]:
        conn = await _connect(target, wait_s)
        try:
            return await _run(conn, command, target, limit)
        finally:
            conn.close()

    return _sync(job)


def relay_command(target: Target, command: str, out: BinaryIO, err: BinaryIO, wait_s: float = 10.0) -> int:
    """Run the user's command over SSH (``ddctl ssh r -- cmd``), its output copied to ``out`` and ``err`` as it comes
    (nothing held, so no limit); its exit status."""

    async def copy(stream: asyncssh.SSHReader[bytes], sink: BinaryIO) -> None:
        while chunk := await stream.read(1 << 16):
            sink.write(chunk)
            sink.flush()

    async def job() -> int:
        conn = await _connect(target, wait_s)
        try:
            async with conn.create_process(command, encoding=None) as process:
                await asyncio.gather(copy(process.stdout, out), copy(process.stderr, err))
                done = await process.wait(check=False)
            return int(done.exit_status or 0)
        finally:
            conn.close()

    return _sync(job)


def read_command(path: str, limit: int) -> str:
    """The remote command that prints at most ``limit + 1`` bytes of ``path`` (one more than read tells a file over
    ``limit``), failing if it cannot be read: a file that is a symlink to ``/dev/zero`` sends no more than that."""
    return f"head -c {limit + 1} -- {shlex.quote(path)}"


def within(data: bytes, host: str, path: str, limit: int) -> bytes:
    """``data`` if it is at most ``limit`` bytes; else TooLarge naming the file and the limit."""
    if len(data) > limit:
        raise TooLarge(f"{host}:{path}: larger than the {limit} bytes it may be; not read")
    return data


def read_text(target: Target, path: str, limit: int = LOG_LIMIT) -> str:
    """A remote file's text ('' if it does not exist); TooLarge past ``limit`` bytes."""
    data = read_bytes(target, path, wait_s=10.0, limit=limit)
    return data.decode("utf-8", errors="replace") if data is not None else ""


def read_bytes(target: Target, path: str, wait_s: float = 5.0, limit: int = FILE_LIMIT) -> bytes | None:
    """A remote file's bytes exactly (no text decoding: checkpoints are binary); None if it cannot be read, TooLarge
    past ``limit`` bytes. The remote command stops at ``limit + 1`` and so does the read here, whatever sshd sends."""

    async def job() -> bytes | None:
        conn = await _connect(target, wait_s)
        try:
            command = read_command(path, limit)
            async with conn.create_process(command, encoding=None, stderr=asyncssh.DEVNULL) as process:
                data = within(await _read_within(process.stdout, limit), target.host, path, limit)
                done = await process.wait(check=False)
            return data if done.exit_status == 0 else None
        finally:
            conn.close()

    return _sync(job)


def ssh_argv(target: Target, known_hosts: Path, command: list[str]) -> list[str]:
    """The OpenSSH client command line for an interactive session with the same pinning."""
    return [
        "ssh",
        "-i",
        str(target.client_key),
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-p",
        str(target.port),
        f"{target.user}@{target.host}",
        *command,
    ]


AGENT_LOG = f"{REMOTE_ROOT}/agent.log"
"""Where a deployed agent's output goes (see ``deploy``)."""


def openssh_command(words: list[str]) -> str:
    """The remote command line exactly as OpenSSH builds it: the words joined by single spaces, for the remote shell.

    No quoting: ``ddctl ssh r -- 'ls -la ~; ps aux'`` runs two commands and ``ddctl ssh r ls -la`` runs ``ls -la``,
    as with ``ssh host ...``."""
    return " ".join(words)


def follow_command(path: str) -> str:
    """A remote command that prints ``path`` from its first line and then every line appended, across rotation."""
    return f"tail -n +1 -F {shlex.quote(path)} 2>/dev/null"


async def stream_lines(target: Target, command: str, wait_s: float = 10.0) -> AsyncIterator[str]:
    """Each line a long-running remote command prints, as it comes, over one SSH session.

    Ends when the command exits or the machine goes away (a preempted VM); cancelling the consumer closes the
    session, which ends the remote command with it."""
    conn = await _connect(target, wait_s)
    try:
        async with conn.create_process(command, encoding="utf-8", errors="replace") as process:
            async for line in process.stdout:
                yield str(line).rstrip("\n")
    except (OSError, asyncssh.Error):
        return
    finally:
        conn.close()
