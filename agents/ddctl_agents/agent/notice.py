"""Spot interruption notices: the agent watches its instance-metadata endpoint and leaves in time.

A preempted spot VM gets a warning (AWS: 2 minutes, GCP: 30 s) on its
metadata endpoint before it is killed. Polling it once a second and ending
training the moment it answers lets the learner push its pending outer
gradients while the instance still exists. Two protocols, told apart by the URL:

- AWS (``/latest/meta-data/spot/instance-action``, 404 until a notice), with
  IMDSv2, the default for new instances: a session token from ``PUT
  /latest/api/token`` goes with every request, else every answer is 401 and a
  real notice would be missed. The token is renewed before it expires, and at
  once after a 401. ddctl's local endpoint (Docker regions) speaks the same.
- GCP (``/computeMetadata/v1/instance/preempted``, ``TRUE``/``FALSE``), with the
  ``Metadata-Flavor: Google`` header it requires; and its sibling
  ``instance/maintenance-event``: ``TERMINATE_ON_HOST_MAINTENANCE`` ends the VM
  too (a GPU VM cannot live-migrate), so it is a notice; ``MIGRATE_...`` and
  ``NONE`` are not.

AWS also posts a *rebalance recommendation* (``events/recommendations/rebalance``)
when an instance is at elevated risk, often well before a notice. It is not a
notice: training goes on; the learner logs it once and its exit summary says so.
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlsplit

import httpx

from ddctl_agents.core.text import printable

log = logging.getLogger(__name__)
TOKEN_PATH = "/latest/api/token"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_S = 21_600
"""IMDSv2 session tokens live up to 6 hours; ours are renewed a minute before they expire."""


class Stop(threading.Event):
    """A stop flag that remembers why it was raised (the learner's summary reports it)."""

    def __init__(self) -> None:
        super().__init__()
        self.reason = "sigterm"
        self.rebalance_recommended = False
        """AWS said the instance is at elevated risk of interruption (training went on)."""

    def trigger(self, reason: str) -> None:
        if not self.is_set():
            self.reason = reason
            self.set()


def is_notice(status: int, body: str) -> bool:
    """200 with anything but GCP's ``FALSE`` is a notice; 404 (AWS: none yet), 401 and errors are not."""
    return status == 200 and body.strip().upper() != "FALSE"


def is_gcp(url: str) -> bool:
    return urlsplit(url).path.startswith("/computeMetadata/")


class NoticeClient:
    """One poll of the notice URL, with the protocol's headers (and, for AWS, a live IMDSv2 token)."""

    def __init__(self, url: str, http: httpx.Client, clock: object = time.monotonic) -> None:
        self.url, self.http, self.clock = url, http, clock
        parts = urlsplit(url)
        self.token_url = f"{parts.scheme}://{parts.netloc}{TOKEN_PATH}"
        self.token: str | None = None
        self.token_until = 0.0

    def poll(self) -> httpx.Response:
        if is_gcp(self.url):
            return self.http.get(self.url, headers={"Metadata-Flavor": "Google"})
        answer = self.http.get(self.url, headers=self._token_header())
        if answer.status_code == 401:  # the token expired or the endpoint restarted: one fresh token, once
            self.token = None
            answer = self.http.get(self.url, headers=self._token_header())
        return answer

    def maintenance(self) -> str | None:
        """GCP only: a host-maintenance event that ends the VM (``TERMINATE_ON_HOST_MAINTENANCE``), else None."""
        if not is_gcp(self.url):
            return None
        answer = self.http.get(f"{self.url.rsplit('/', 1)[0]}/maintenance-event", headers={"Metadata-Flavor": "Google"})
        event = answer.text.strip().upper()
        return event if answer.status_code == 200 and event.startswith("TERMINATE") else None

    def rebalance(self) -> bool:
        """AWS only: has a rebalance recommendation been posted for this instance (200 on its path)?"""
        if is_gcp(self.url):
            return False
        answer = self.http.get(f"{self.token_url.removesuffix(TOKEN_PATH)}{REBALANCE_PATH}", headers=self._token_header())
        return answer.status_code == 200

    def _token_header(self) -> dict[str, str]:
        now = self.clock()  # type: ignore[operator]
        if self.token is None or now >= self.token_until:
            got = self.http.put(self.token_url, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
            if got.status_code != 200:
                return {}  # IMDSv1 only (no token service): ask without one
            token = got.text.strip()
            if not (0 < len(token) <= 1024 and token.isascii() and token.isprintable() and " " not in token):
                log.warning("the metadata service's token is not one (%.60r): asking without it", token)
                return {}  # kept, it would make every poll fail for six hours: asked for again at the next poll
            self.token, self.token_until = token, now + TOKEN_TTL_S - 60
        return {"X-aws-ec2-metadata-token": self.token}


def watch(url: str, stop: Stop, every_s: float = 1.0) -> threading.Thread:
    """Poll ``url`` until ``stop`` is set; a notice sets it with reason ``preemption_notice``."""

    def loop() -> None:
        with httpx.Client(timeout=2.0) as http:
            client, said = NoticeClient(url, http), ""
            while not stop.wait(every_s):
                try:
                    look(client)
                except httpx.HTTPError:
                    continue  # the endpoint being away is not a notice
                except Exception as exc:  # noqa: BLE001 - an answer of another shape must not end the watch
                    if (why := printable(f"{type(exc).__name__}: {exc}", 200)) != said:
                        log.warning("the metadata service's answer could not be read (%s): still watching", why)
                    said = why

    def look(client: NoticeClient) -> None:
        response = client.poll()
        if is_notice(response.status_code, response.text):
            log.warning("spot interruption notice: %s", printable(response.text.strip(), 200))
            stop.trigger("preemption_notice")
        elif is_gcp(url):
            if (event := client.maintenance()) is not None:
                log.warning("host maintenance ends this VM: %s", printable(event, 200))
                stop.trigger("preemption_notice")
        elif not stop.rebalance_recommended and client.rebalance():
            stop.rebalance_recommended = True
            log.warning("rebalance recommendation: this instance is at elevated risk of interruption")

    thread = threading.Thread(target=loop, name="notice-watch", daemon=True)
    thread.start()
    return thread
