"""The learner's upload slots: an uploader takes one before it takes an update, so at most the cap are in flight.

A fixed count keeps that many in flight whatever the link; a paced learner's cap is the
fewest that keep its measured uplink busy (``core/pacing``), fed by every acknowledged
upload's timing, so the update due first is not slowed by others sharing the link.
"""

from __future__ import annotations

import argparse
import logging
import threading

from ddctl_agents.core.pacing import AUTO_MOST, InFlightCap, parse_in_flight

log = logging.getLogger(__name__)


class UploadSlots:
    """``fixed`` uploads in flight, or (None) as few as the pacer says, up to ``AUTO_MOST``. Thread-safe."""

    def __init__(self, fixed: int | None) -> None:
        if fixed is not None and fixed < 1:
            raise ValueError(f"uploads in flight must be >= 1, got {fixed}")
        self.most = AUTO_MOST if fixed is None else fixed
        """Uploader threads to start: the cap never exceeds it."""
        self.pacer = InFlightCap(self.most) if fixed is None else None
        self._gate = threading.Condition()
        self._taken = 0

    def cap(self) -> int:
        with self._gate:
            return self._cap()

    def _cap(self) -> int:
        return self.most if self.pacer is None else self.pacer.cap()

    def take(self, stopping: threading.Event) -> bool:
        """Wait until fewer than the cap are in flight and count one more; False once ``stopping`` is set."""
        with self._gate:
            while not stopping.is_set():
                if self._taken < self._cap():
                    self._taken += 1
                    return True
                self._gate.wait(0.2)
        return False

    def free(self) -> None:
        with self._gate:
            self._taken -= 1
            self._gate.notify_all()

    def timed(self, window: tuple[int, float] | None, wall_s: float, alone: bool) -> None:
        """An acknowledged upload: ``window`` (bytes, kernel busy seconds; None where the kernel says nothing),
        ``wall_s`` from leaving the queue (encoding included) to the answer."""
        if self.pacer is None:
            return
        with self._gate:
            before = self.pacer.cap()
            if window is None:
                self.pacer.observe_untimed()
            else:
                self.pacer.observe(window[0], window[1], wall_s, alone)
            after = self.pacer.cap()
            if after != before:
                transfer, gap = self.pacer.transfer_s() or 0.0, self.pacer.gap_s()
                log.info("uploads in flight: %d -> %d (transfer %.3f s alone, gap %.3f s)", before, after, transfer, gap)
            self._gate.notify_all()


def in_flight_argument(text: str) -> int | None:
    """argparse's type for ``--parallel-uploads``: the error says what is allowed."""
    try:
        return parse_in_flight(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
