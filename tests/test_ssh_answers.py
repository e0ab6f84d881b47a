"""What the laptop takes from a machine over SSH (a file, a command's output, an agent's log) is another machine's
answer: read no further than its caller needs, whatever that machine sends. A real SSH server in this process plays
the machine: honest (it runs the command) or not (8 MiB, whatever the command)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest

from ddctl.providers import console, deploy


class LocalVm:
    """An sshd on 127.0.0.1 that runs each command in a local shell (``honest``) or answers any command with
    8 MiB of zeros (a VM whose sshd ignores the command), standing in for a VM."""

    def __init__(self, tmp: Path) -> None:
        self.honest, self.commands = True, list[str]()
        host_key, client_key = asyncssh.generate_private_key("ssh-ed25519"), asyncssh.generate_private_key("ssh-ed25519")
        (tmp / "client").write_bytes(client_key.export_private_key())
        (tmp / "client").chmod(0o600)
        ready, self.loop = threading.Event(), asyncio.new_event_loop()
        vm = self

        class Server(asyncssh.SSHServer):
            def begin_auth(self, username: str) -> bool:
                return True

            def public_key_auth_supported(self) -> bool:
                return True

            def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
                return key.public_data == client_key.public_data

        async def handle(process: asyncssh.SSHServerProcess[bytes]) -> None:
            vm.commands.append(str(process.command))
            if not vm.honest:
                with contextlib.suppress(OSError, asyncssh.Error):
                    for _ in range(128):  # 8 MiB, then a clean exit (a read with no limit takes it all)
                        process.stdout.write(b"\0" * (1 << 16))
                        await process.stdout.drain()
                    process.exit(0)
                return
            pipe = asyncio.subprocess.PIPE
            shell = await asyncio.create_subprocess_shell(str(process.command), stdout=pipe, stderr=pipe)
            out, err = await shell.communicate()
            process.stdout.write(out)
            process.stderr.write(err)
            process.exit(shell.returncode or 0)

        async def serve() -> None:
            server = await asyncssh.listen(
                "127.0.0.1", 0, server_host_keys=[host_key], server_factory=Server, process_factory=handle, encoding=None
            )
            self.port, self.server = server.sockets[0].getsockname()[1], server
            ready.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self.loop)
        ready.wait(10)
        self.target = deploy.Target("127.0.0.1", host_key.export_public_key().decode().strip(), tmp / "client", self.port)


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[LocalVm]:
    machine = LocalVm(tmp_path)
    yield machine

    async def close() -> None:
        machine.server.close()
        await machine.server.wait_closed()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(close(), machine.loop).result(10)
    machine.loop.call_soon_threadsafe(machine.loop.stop)
    machine.thread.join(10)
    machine.loop.close()


def test_a_remote_file_is_read_whole_up_to_its_limit_and_refused_past_it(vm: LocalVm, tmp_path: Path) -> None:
    (tmp_path / "s.json").write_bytes(b"x" * 100)
    assert deploy.read_bytes(vm.target, str(tmp_path / "s.json"), limit=100) == b"x" * 100
    assert deploy.read_text(vm.target, str(tmp_path / "s.json"), limit=100) == "x" * 100
    assert deploy.read_bytes(vm.target, str(tmp_path / "missing")) is None
    assert deploy.read_text(vm.target, str(tmp_path / "missing")) == ""
    with pytest.raises(deploy.TooLarge, match=r"s\.json: larger than the 99 bytes it may be"):
        deploy.read_bytes(vm.target, str(tmp_path / "s.json"), limit=99)
    assert vm.commands[-1] == f"head -c 100 -- {tmp_path / 's.json'}"  # the VM sends one byte more at most


def test_a_summary_linked_to_a_large_file_is_refused_after_a_mib(vm: LocalVm, tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"\0" * (3 << 20))  # /dev/zero in the audit: bounded here, so an unbounded read ends
    (tmp_path / "summary.json").symlink_to(tmp_path / "big")
    with pytest.raises(deploy.TooLarge, match=f"summary.json: larger than the {1 << 20} bytes"):
        console.read_file(lambda: vm.target, lambda: "", str(tmp_path / "summary.json"))
    assert vm.commands[-1] == f"head -c {(1 << 20) + 1} -- {tmp_path / 'summary.json'}"
    assert console.limit_of("/opt/ddctl/summary.json") == console.limit_of("/opt/ddctl/state/summary.json") == 1 << 20
    assert console.limit_of("/opt/ddctl/state/tape.jsonl") == deploy.FILE_LIMIT


def test_a_vm_that_ignores_the_command_and_sends_more_is_cut_at_the_limit(vm: LocalVm) -> None:
    vm.honest = False
    started = time.monotonic()
    with pytest.raises(deploy.TooLarge, match="/opt/ddctl/summary.json: larger than the 1048576 bytes"):
        console.read_file(lambda: vm.target, lambda: "", "/opt/ddctl/summary.json")
    assert time.monotonic() - started < 10


def test_a_command_on_a_machine_answers_its_status_and_both_streams_within_a_limit(vm: LocalVm) -> None:
    assert deploy.run_command(vm.target, "echo out; echo err >&2; exit 3") == (3, "out\n", "err\n")
    with pytest.raises(deploy.TooLarge, match=r"`head -c 2000000 /dev/zero` printed more than the 1048576 bytes"):
        deploy.run_command(vm.target, "head -c 2000000 /dev/zero")
    with pytest.raises(deploy.TooLarge, match="more than the 1000 bytes"):  # stderr is held to it too
        deploy.run_command(vm.target, "head -c 1001 /dev/zero >&2", limit=1000)
    assert deploy.run_command(vm.target, "head -c 1000 /dev/zero >&2", limit=1000) == (0, "", "\0" * 1000)


def test_the_users_command_is_copied_as_it_comes_with_no_limit(vm: LocalVm) -> None:
    """``ddctl ssh r -- cmd``: nothing is held, so a command that prints a lot is not cut."""
    out, err = io.BytesIO(), io.BytesIO()
    assert deploy.relay_command(vm.target, "head -c 3000000 /dev/zero; echo done >&2; exit 4", out, err) == 4
    assert out.getvalue() == b"\0" * 3_000_000 and err.getvalue() == b"done\n"


def test_a_machine_that_sends_more_than_a_command_may_print_is_cut_at_the_limit(vm: LocalVm) -> None:
    vm.honest = False  # 8 MiB, whatever the command
    started = time.monotonic()
    with pytest.raises(deploy.TooLarge, match="`true` printed more than the 1048576 bytes"):
        deploy.run_command(vm.target, "true")
    assert time.monotonic() - started < 10
    assert deploy.run_command(vm.target, "true", limit=16 << 20) == (0, "\0" * (8 << 20), "")


def test_a_retired_machines_log_is_collected_up_to_the_log_limit(
    vm: LocalVm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console, "log_command", lambda: "head -c 2000000 /dev/zero | tr '\\0' a")  # over 1 MiB
    console.collect_log(lambda: vm.target, lambda: "", tmp_path / "vm.log", "i-1")
    assert (tmp_path / "vm.log").read_text() == "==> i-1 <==\n" + "a" * 2_000_000


def test_the_agents_log_is_collected_as_its_last_bytes() -> None:
    assert console.log_command() == f"tail -c {deploy.LOG_LIMIT} /opt/ddctl/agent.log"
