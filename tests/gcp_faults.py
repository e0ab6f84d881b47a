"""The Compute Engine fake's fault plan: calls that answer Google's error bodies (``fail``), operations that end DONE
with an error (``fail_operation``), unknown projects, zones and regions answered 404, and the call log. A mixin of
``GcpCloud``, whose state (``_rules``, ``_calls``, ``_lock``) it reads."""

from __future__ import annotations

import threading
from typing import Any

import gcp_shapes as gs
from gcp_routes import METHODS, OPERATION_METHODS, Call, Rule
from gcp_shapes import ApiError, not_found


class FaultPlan:
    """Says no the way Google does, for the calls a test names."""

    project: str
    zones: dict[str, list[str]]
    _region: dict[str, str]
    _lock: threading.RLock
    _rules: list[Rule]
    _calls: list[Call]

    # -- fault plan ------------------------------------------------------------------------------------------------
    def fail(self, method: str, *, status: int = 403, reason: str = "quotaExceeded", message: str | None = None,
             status_text: str | None = None, times: int | None = 1, zone: str | None = None,
             error_info: dict[str, Any] | None = None) -> None:  # fmt: skip
        """The next `times` calls of `method` (None: all), in `zone` if given, answer HTTP `status` with Google's body."""
        self._check_method(method, METHODS)
        text = message or gs.default_message(reason, status).replace("{project}", self.project).replace("{zone}", zone or "")
        error = ApiError(status, text, reason, status_text=status_text, error_info=error_info)
        with self._lock:
            self._rules.append(Rule(method, zone, times, error=error))

    def fail_operation(self, method: str, error: dict[str, Any] | None = None, *, code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
                       message: str | None = None, error_details: list[dict[str, Any]] | None = None,
                       errorDetails: list[dict[str, Any]] | None = None, http_status: int | None = None,
                       times: int | None = 1, zone: str | None = None) -> None:  # fmt: skip
        """Accept the call but end its Operation DONE with error.errors=[{code, message, errorDetails}]; nothing happens.

        `error` (or **ZONE_EXHAUSTED, whose camelCase errorDetails is accepted) is an errors[] entry from gcp_shapes.
        """
        self._check_method(method, OPERATION_METHODS)
        entry: dict[str, Any] = (
            dict(error) if error else {"code": code, "message": message, "errorDetails": error_details or errorDetails or []}
        )
        if entry.get("message") is None:
            entry["message"] = (
                gs.ZONE_EXHAUSTED_PLAIN["message"] if entry["code"].startswith("ZONE_RESOURCE_POOL") else entry["code"]
            )
        status = http_status or gs.OPERATION_HTTP_STATUS.get(entry["code"], 503)
        with self._lock:
            self._rules.append(Rule(method, zone, times, op_error=entry, http_status=status))

    def calls(self, method: str | None = None, zone: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self._calls if method in (None, c.method) and zone in (None, c.zone)]

    def clear(self) -> None:
        """Drop the fault rules only."""
        with self._lock:
            self._rules.clear()

    @staticmethod
    def _check_method(method: str, allowed: set[str]) -> None:
        if method not in allowed:
            raise ValueError(f"{method!r} is not one of {sorted(allowed)}")

    def _scope_and_fault(self, method: str, p: dict[str, str]) -> dict[str, Any] | None:
        """404 for an unknown project or zone; then the newest matching rule raises (fail) or returns an op error."""
        if p["project"] != self.project:
            raise not_found(f"projects/{p['project']}")
        if "zone" in p and p["zone"] not in self._region:
            raise not_found(f"projects/{self.project}/zones/{p['zone']}")
        if "region" in p and p["region"] not in self.zones:
            raise not_found(f"projects/{self.project}/regions/{p['region']}")
        rule = next((r for r in reversed(self._rules) if r.method == method and r.zone in (None, p.get("zone"))), None)
        if rule is None:
            return None
        if rule.times is not None:
            rule.times -= 1
            if rule.times <= 0:
                self._rules.remove(rule)
        if rule.error is not None:
            raise rule.error
        zone = p.get("zone", "")
        region = self._region.get(zone, "")
        others = ",".join(z for z in self.zones.get(region, []) if z != zone)
        return {**gs.fill(rule.op_error, {"project": self.project, "zone": zone, "region": region, "zones_available": others}),
                "httpStatus": rule.http_status}  # fmt: skip
