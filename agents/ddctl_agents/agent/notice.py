"""Spot interruption notices: the agent watches its instance-metadata endpoint and leaves in time.

A preempted spot VM gets a warning (AWS: 2 minutes, GCP: 30 s) on its
metadata endpoint before it is killed. Polling it once a second and ending
training the moment it answers lets the learner push its pending outer
gradients while the instance still exists. The same watcher serves AWS
(``/latest/meta-data/spot/instance-action``: 404 until a notice), GCP
(``instance/preempted``: ``TRUE``/``FALSE``) and ddctl's local endpoint.
"""

from __future__ import annotations

import logging
import threading

import httpx

log = logging.getLogger("ddctl.notice")


class Stop(threading.Event):
    """A stop flag that remembers why it was raised (the learner's summary reports it)."""

    def __init__(self) -> None:
        super().__init__()
        self.reason = "sigterm"

    def trigger(self, reason: str) -> None:
        if not self.is_set():
            self.reason = reason
            self.set()


def is_notice(status: int, body: str) -> bool:
    """200 with anything but GCP's ``FALSE`` is a notice; 404 (AWS: none yet) and errors are not."""
    return status == 200 and body.strip().upper() != "FALSE"


def watch(url: str, stop: Stop, every_s: float = 1.0) -> threading.Thread:
    """Poll ``url`` until ``stop`` is set; a notice sets it with reason ``preemption_notice``."""

    def loop() -> None:
        with httpx.Client(timeout=2.0, headers={"Metadata-Flavor": "Google"}) as client:
            while not stop.wait(every_s):
                try:
                    response = client.get(url)
                except httpx.HTTPError:
                    continue  # the endpoint being away is not a notice
                if is_notice(response.status_code, response.text):
                    log.warning("spot interruption notice: %s", response.text.strip()[:200])
                    stop.trigger("preemption_notice")

    thread = threading.Thread(target=loop, name="notice-watch", daemon=True)
    thread.start()
    return thread
