"""The kernel's own account of a TCP connection (Linux ``TCP_INFO``), for measuring links honestly.

An application that times its own reads or writes measures its threads as much
as the wire: a reader that wakes late finds a whole transfer waiting and reads a
link as ten times faster than it is. The sending side's kernel knows better. It
counts the bytes the peer acknowledged (``tcpi_bytes_acked``) and the time the
connection had data in flight or queued (``tcpi_busy_time``), so bytes acked
over busy time is the rate the link delivered while it had something to do,
whatever the threads were doing. Both need Linux 4.10 or later.

``busy_time`` ticks in jiffies (4 ms at HZ=250): unbiased, but coarse for a
single short transfer, so ``core/links.py`` pools transfers before it reads a
rate. ``tcpi_delivery_rate`` (one rate sample, that of the latest ACK) swung
between 26 and 48 Mbit/s on a 50 Mbit/s link in our measurements, so it is
parsed for diagnostics but not used.

``read`` answers None wherever the figures are not to be had (not Linux, a
kernel without the fields, a closed socket, an object that is not a socket):
callers then have no measurement rather than a wrong one.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

from ddctl_agents.core.links import SendCounters

_LAYOUT = struct.Struct("=8B24I4Q6IQ3Q")
"""``struct tcp_info`` from linux/tcp.h up to ``tcpi_sndbuf_limited`` (192 bytes, all fields naturally aligned)."""
_BUFLEN = 256
"""Bytes asked of getsockopt: newer kernels append fields, which are ignored."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpInfo:
    """The fields of ``struct tcp_info`` that measure a link (times in microseconds, rates in bytes/s)."""

    unacked: int
    """Segments sent and not yet acknowledged."""
    notsent_bytes: int
    """Bytes written by the application that the kernel has not sent yet."""
    last_ack_ms: int
    """Milliseconds since the peer last acknowledged anything: when idle, since the last transfer ended."""
    rtt_us: int
    min_rtt_us: int
    bytes_acked: int
    bytes_received: int
    delivery_rate: int
    delivery_rate_app_limited: bool
    busy_us: int
    """Time with data in flight or queued, including the two limited times below."""
    rwnd_limited_us: int
    """Time the peer's receive window held the sender back (the reader, not the link, was slow)."""
    sndbuf_limited_us: int

    @property
    def idle(self) -> bool:
        """Nothing unsent and nothing unacknowledged: every byte written so far has crossed the link."""
        return self.unacked == 0 and self.notsent_bytes == 0


def parse(raw: bytes) -> TcpInfo | None:
    """``struct tcp_info`` as returned by getsockopt; None when it is too short (a kernel before 4.10)."""
    if len(raw) < _LAYOUT.size:
        return None
    v = _LAYOUT.unpack_from(raw)
    u32, u64, more, rest = v[8:32], v[32:36], v[36:42], v[42:]
    return TcpInfo(
        unacked=u32[4],
        last_ack_ms=u32[12],
        rtt_us=u32[15],
        bytes_acked=u64[2],
        bytes_received=u64[3],
        notsent_bytes=more[2],
        min_rtt_us=more[3],
        delivery_rate=rest[0],
        delivery_rate_app_limited=bool(v[7] & 1),
        busy_us=rest[1],
        rwnd_limited_us=rest[2],
        sndbuf_limited_us=rest[3],
    )


def read(sock: Any) -> TcpInfo | None:
    """The kernel's figures for ``sock`` (a socket, an ``ssl.SSLSocket`` or asyncio's transport socket), or None."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None or sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, option, _BUFLEN)
    except (OSError, AttributeError, TypeError, ValueError):
        return None
    return parse(raw) if isinstance(raw, bytes) else None


def sending(sock: Any) -> SendCounters | None:
    """What ``core.links`` needs of the sending side of ``sock``, or None where the kernel cannot say."""
    info = read(sock)
    if info is None:
        return None
    try:
        connection = hash((sock.getsockname(), sock.getpeername()))
    except (OSError, AttributeError, TypeError):
        return None
    return SendCounters(
        connection=connection,
        acked=info.bytes_acked,
        busy_s=info.busy_us / 1e6,
        stalled_s=info.rwnd_limited_us / 1e6,
        idle=info.idle,
        quiet_s=info.last_ack_ms / 1e3 if info.idle else 0.0,
    )
