"""The kernel's TCP_INFO as ``ddctl_agents.tcpinfo`` reads it, and a link measured with it."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from ddctl.providers.linkshape import available, shaped_link
from ddctl_agents import tcpinfo
from ddctl_agents.core.links import DeliveryMeter, SendCounters
from ddctl_agents.waiting import wait_until

linux_only = pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's")


def raw_info(**fields: int) -> bytes:
    """A ``struct tcp_info`` with the given fields set (names without ``tcpi_``), the rest zero."""
    slots = {"app_limited": 7, "unacked": 12, "last_ack_recv": 20, "rtt": 23, "bytes_acked": 34, "bytes_received": 35}
    slots |= {"notsent_bytes": 38}
    slots |= {"min_rtt": 39, "delivery_rate": 42, "busy_time": 43, "rwnd_limited": 44, "sndbuf_limited": 45}
    packed = [0] * 46  # 8 bytes, 24 u32, 4 u64, 6 u32, 4 u64
    for name, value in fields.items():
        packed[slots[name]] = value
    return tcpinfo._LAYOUT.pack(*packed) + b"\0" * 40  # a newer kernel's extra fields are ignored


def test_struct_tcp_info_is_parsed_field_by_field() -> None:
    info = tcpinfo.parse(
        raw_info(
            app_limited=1,
            unacked=3,
            last_ack_recv=1_250,
            rtt=379,
            bytes_acked=3_000_001,
            bytes_received=77,
            notsent_bytes=5,
            min_rtt=7,
            delivery_rate=9_354_714_285,
            busy_time=8_000,
            rwnd_limited=4_000,
            sndbuf_limited=1_000,
        )
    )
    assert info == tcpinfo.TcpInfo(
        unacked=3,
        notsent_bytes=5,
        last_ack_ms=1_250,
        rtt_us=379,
        min_rtt_us=7,
        bytes_acked=3_000_001,
        bytes_received=77,
        delivery_rate=9_354_714_285,
        delivery_rate_app_limited=True,
        busy_us=8_000,
        rwnd_limited_us=4_000,
        sndbuf_limited_us=1_000,
    )
    assert not info.idle and tcpinfo.parse(raw_info()).idle  # type: ignore[union-attr]


class Recorded:
    """A socket whose TCP_INFO is the given bytes."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        return self.raw

    def getsockname(self) -> tuple[str, int]:
        return ("10.0.0.1", 4000)

    def getpeername(self) -> tuple[str, int]:
        return ("10.0.0.2", 443)


@linux_only
def test_an_idle_connection_says_since_when_and_a_busy_one_says_now() -> None:
    idle = tcpinfo.sending(Recorded(raw_info(bytes_acked=600_000, busy_time=96_000, last_ack_recv=2_500)))
    assert idle is not None and idle.idle and idle.quiet_s == 2.5 and idle.acked == 600_000 and idle.busy_s == 0.096
    busy = tcpinfo.sending(Recorded(raw_info(unacked=4, last_ack_recv=2_500)))
    assert busy is not None and not busy.idle and busy.quiet_s == 0.0  # its transfer has not ended


def test_a_kernel_without_the_busy_time_fields_says_nothing() -> None:
    assert tcpinfo.parse(raw_info()[:160]) is None  # before Linux 4.10: no tcpi_busy_time


def test_reading_what_is_not_an_open_tcp_socket_answers_none() -> None:
    assert tcpinfo.read(None) is None and tcpinfo.read(object()) is None and tcpinfo.sending("socket") is None
    sock = socket.socket()
    sock.close()
    assert tcpinfo.read(sock) is None and tcpinfo.sending(sock) is None


@pytest.fixture
def sink() -> Iterator[socket.socket]:
    """A connected socket whose peer reads and discards everything on a thread."""
    listener = socket.create_server(("127.0.0.1", 0))

    def drain() -> None:
        peer, _ = listener.accept()
        with peer:
            while peer.recv(1 << 20):
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    sender = socket.create_connection(listener.getsockname())
    yield sender
    sender.close()
    listener.close()
    reader.join(5)


@linux_only
def test_the_kernel_counts_what_the_peer_acknowledged(sink: socket.socket) -> None:
    before = tcpinfo.sending(sink)
    assert before is not None and before.idle and before.acked <= 1  # nothing sent yet (a SYN counts as one)
    sink.sendall(b"x" * 1_000_000)
    after = wait_until(lambda: (c := tcpinfo.sending(sink)) is not None and c.idle and c, timeout_s=10, what="acked")
    assert isinstance(after, SendCounters) and after.connection == before.connection
    assert after.acked - before.acked == 1_000_000 and after.busy_s >= before.busy_s


@linux_only
def test_the_kernel_says_how_long_ago_the_last_byte_was_acknowledged(sink: socket.socket) -> None:
    sent = time.monotonic()
    sink.sendall(b"x" * 1_000_000)
    wait_until(lambda: (c := tcpinfo.sending(sink)) is not None and c.idle, timeout_s=10, what="acked")
    time.sleep(0.5)
    after = tcpinfo.sending(sink)
    assert after is not None and after.idle
    assert 0.49 <= after.quiet_s <= time.monotonic() - sent + 0.01  # acked at least 0.5 s ago, and not before the send


SINK = """
import socket, sys
listener = socket.create_server((sys.argv[1], 5001))
print("ready", flush=True)
peer, _ = listener.accept()
while peer.recv(1 << 20):
    pass
"""


@pytest.mark.slow
@linux_only
@pytest.mark.skipif(available() is not None, reason=f"{available()}")
def test_bytes_acked_over_busy_time_reads_a_shaped_link_whenever_it_is_read() -> None:
    """20 Mbit/s with tc tbf: the meter reads the rate (less TCP/IP headers), however late it looks."""
    rate_mbit = 20.0
    with shaped_link("ddctl-tcpinfo-test", up_mbit=rate_mbit, down_mbit=rate_mbit) as link:
        peer = subprocess.Popen(link.command(sys.executable, "-c", SINK, link.peer_ip), stdout=subprocess.PIPE, text=True)
        try:
            assert peer.stdout is not None and peer.stdout.readline().strip() == "ready"
            sender = socket.create_connection((link.peer_ip, 5001))
            # a new connection's windows open as it goes (its first 1.2 MB read 14.7 Mbit/s once in CI):
            # warm it up, so every window below times the link itself
            sender.sendall(b"x" * 1_200_000)
            wait_until(lambda: (c := tcpinfo.sending(sender)) is not None and c.idle, timeout_s=10, what="warm-up")
            meter, samples = DeliveryMeter(), []
            for n in range(8):
                if (sample := meter.read(tcpinfo.sending(sender))) is not None:
                    samples.append(sample)
                sender.sendall(b"x" * 600_000)  # 0.24 s at 20 Mbit/s: returns long before the bytes are across
                if n % 2:  # read at once (mid-transfer) or only once it is all across: the figure is the same
                    wait_until(lambda: (c := tcpinfo.sending(sender)) is not None and c.idle, timeout_s=10, what="acked")
            wait_until(lambda: (c := tcpinfo.sending(sender)) is not None and c.idle, timeout_s=10, what="acked")
            last = meter.read(tcpinfo.sending(sender))
            sender.close()
        finally:
            peer.kill()
            peer.communicate()
    assert last is not None  # idle at the end: the last window is read
    mbit = [nbytes * 8 / seconds / 1e6 for nbytes, seconds in [*samples, last]]
    # four windows of 1.2 MB: their median within the rate's bounds, and none far from it. A thread-timed figure is off
    # by several times; one window under CI load read 0.80x ([19.2, 16.1, 19.2, 19.2]: tbf's queue, or a late reader)
    assert len(mbit) >= 3 and 0.9 * rate_mbit <= statistics.median(mbit) <= 1.05 * rate_mbit, mbit
    assert all(0.7 * rate_mbit <= m <= 1.05 * rate_mbit for m in mbit), mbit
