"""An offline Compute Engine (REST v1) for tests: a real HTTP server that the real google-cloud-compute clients talk to.

There is no official emulator, so this is a small faithful fake of the part ddctl uses: instances (insert, get, list,
aggregatedList, delete, setLabels, setMetadata, simulateMaintenanceEvent), zone and global operations (get, wait, list,
delete), firewalls, zones and the default network. JSON is what Google sends: camelCase, int64s as strings, full
resource URLs, Operations that end DONE with error.errors[] on failure. A fault plan (fail, fail_operation) says no the
way Google does; the state API (instances, set_status, remove, preempted, ...) is for tests and a test "hypervisor".

Pointing a client here (verified against google-cloud-compute 1.57): an `http://` endpoint is taken as is, the REST
transport keeps the scheme it is given; AnonymousCredentials send no Authorization header:

    compute_v1.InstancesClient(client_options=ClientOptions(api_endpoint=cloud.endpoint),
                               credentials=AnonymousCredentials(), transport="rest")   # or cloud.client("InstancesClient")

What the library does that a test must know:
- A sync error becomes google.api_core.exceptions by HTTP status: 400 BadRequest, 403 Forbidden, 404 NotFound,
  409 Conflict, 412 PreconditionFailed, 429 TooManyRequests, 503 ServiceUnavailable. The Google reason ("quotaExceeded")
  is in `exc.errors[0]["reason"]` (the body's error.errors); `exc.reason` is None unless the body has a
  google.rpc.ErrorInfo detail (fail(..., error_info={"reason": ..., "domain": ...}) adds one). `exc.code` is the status.
- get/list/aggregatedList (and zoneOperations.get) retry ServiceUnavailable by themselves, for up to 600 s; insert,
  delete and wait do not. So fail("instances.get", status=503) is invisible to the caller unless times= runs out.
- `list(filter=...)` is not a keyword: pass `request={"project": ..., "zone": ..., "filter": ..., "max_results": ...}`.
- The non-unary `insert()` polls through a ZoneOperationsClient it builds itself WITHOUT your client_options, i.e. against
  compute.googleapis.com. Use insert_unary() + ZoneOperationsClient.wait(), or clients from cloud.client(), which wires
  those pollers here too.
"""

from __future__ import annotations

import copy
import http
import json
import secrets
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import gcp_shapes as gs
from gcp_faults import FaultPlan
from gcp_resources import NetworkResources
from gcp_routes import DEFAULT_ZONES, ROUTES, STATUSES, Call, Life, Op, Req, Rule, hosts, scope
from gcp_shapes import BASE, ApiError, fingerprint, not_found, now_rfc3339
from served import Served


class GcpCloud(FaultPlan, NetworkResources, Served):
    """Compute Engine on 127.0.0.1:<free port>; thread-safe. State changes that take time happen lazily, on the next look."""

    thread_name = "gcp-cloud"
    WAIT_S = 2.0  # how long operations/{op}/wait blocks at most (Google: up to 2 minutes)

    def __init__(self, *, project: str = "ddctl-test", zones: dict[str, list[str]] | None = None, op_delay_s: float = 0.0,
                 preempt_notice_s: float = 30.0) -> None:  # fmt: skip
        self.project, self.op_delay_s, self.preempt_notice_s = project, op_delay_s, preempt_notice_s
        self.zones = copy.deepcopy(zones or DEFAULT_ZONES)
        self._region = {z: region for region, zs in self.zones.items() for z in zs}
        self._lock = threading.RLock()
        self._nat, self._internal = hosts(gs.NAT_POOL, 0), hosts(gs.INTERNAL_POOL, 1)  # never reset: addresses are never reused
        self._instances: dict[tuple[str, str], dict[str, Any]] = {}
        self._lives: dict[tuple[str, str], Life] = {}
        self._firewalls: dict[str, dict[str, Any]] = {}
        self._ops: dict[tuple[str | None, str], Op] = {}
        self._addresses: dict[tuple[str, str], dict[str, Any]] = {}  # ("regions/R", name) -> Address
        self._consoles: dict[tuple[str, str], str] = {}
        self._rules: list[Rule] = []
        self._calls: list[Call] = []

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {"DDCTL_GCP_ENDPOINT": self.endpoint, "GOOGLE_CLOUD_PROJECT": self.project}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _Handler

    def client(self, name: str) -> Any:
        """A compute_v1 client (e.g. "InstancesClient") wired here, including the operation pollers insert() uses."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import compute_v1

        def make(cls_name: str) -> Any:
            cls = getattr(compute_v1, cls_name)
            anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
            return cls(client_options=ClientOptions(api_endpoint=self.endpoint), credentials=anonymous, transport="rest")

        made = make(name)
        pollers = getattr(made._transport, "_extended_operations_services", None)
        if pollers is not None and not name.endswith("OperationsClient"):
            pollers.update(zone_operations=make("ZoneOperationsClient"), global_operations=make("GlobalOperationsClient"))
        return made

    # -- state, for tests and the hypervisor ---------------------------------------------------------------------------
    def instances(self) -> list[dict[str, Any]]:
        with self._lock:
            self._advance()
            return [copy.deepcopy(i) for _, i in sorted(self._instances.items())]

    def instance(self, zone: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self._advance()
            return copy.deepcopy(self._instances.get((zone, name)))

    def firewalls(self) -> list[dict[str, Any]]:
        with self._lock:
            self._advance()
            return [copy.deepcopy(f) for _, f in sorted(self._firewalls.items())]

    def addresses(self) -> list[dict[str, Any]]:
        """Every reserved address, in every region."""
        with self._lock:
            return [copy.deepcopy(a) for _, a in sorted(self._addresses.items())]

    def set_console(self, zone: str, name: str, text: str) -> None:
        """What the VM printed on serial port 1 (the hypervisor's record of a container's output)."""
        with self._lock:
            self._consoles[(zone, name)] = text

    def set_status(self, zone: str, name: str, status: str) -> None:
        """Say what the VM did (e.g. powered off: "TERMINATED"); KeyError if there is no such instance."""
        if status not in STATUSES:
            raise ValueError(f"unknown instance status {status!r}")
        with self._lock:
            self._instances[(zone, name)]["status"] = status

    def remove(self, zone: str, name: str) -> None:
        """Gone, as after a DELETE termination action; no error if it already is."""
        with self._lock:
            self._instances.pop((zone, name), None)
            self._lives.pop((zone, name), None)

    def preempted(self, zone: str, name: str) -> bool:
        """What metadata `instance/preempted` answers (False once the instance is gone)."""
        with self._lock:
            self._advance()
            life = self._lives.get((zone, name))
            return bool(life and life.preempted)

    def maintenance_event(self, zone: str, name: str) -> str:
        """What metadata `instance/maintenance-event` answers: NONE, MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_..."""
        with self._lock:
            self._advance()
            life = self._lives.get((zone, name))
            return life.maintenance if life else "NONE"

    def address_of(self, nat_ip: str) -> tuple[str, str] | None:
        with self._lock:
            for (zone, name), inst in self._instances.items():
                for nic in inst.get("networkInterfaces", []):
                    if any(ac.get("natIP") == nat_ip for ac in nic.get("accessConfigs", [])):
                        return zone, name
            return None

    def reset(self) -> None:
        """Forget instances, firewalls, operations, rules and calls (handed-out addresses stay used)."""
        with self._lock:
            self._instances, self._lives, self._firewalls, self._ops, self._rules, self._calls = {}, {}, {}, {}, [], []
            self._addresses, self._consoles = {}, {}

    # -- HTTP ------------------------------------------------------------------------------------------------------
    def _dispatch(self, verb: str, raw_path: str, raw_body: bytes) -> tuple[int, Any]:
        """Route, check scope, apply the fault plan, run the handler; log the call either way."""
        split = urlsplit(raw_path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        match = next(((key, m.groupdict()) for v, rx, key in ROUTES if v == verb and (m := rx.match(split.path))), None)
        method, params = match or ("unknown", {})
        body: dict[str, Any] | None = None
        try:
            try:
                body = json.loads(raw_body) if raw_body.strip() else None
            except ValueError as e:
                raise ApiError(400, "Invalid JSON payload received.", "parseError") from e
            if match is None:
                raise ApiError(404, f"The requested URL {split.path} was not found.", "notFound")
            status, payload = (
                200,
                self._wait(method, params) if method.endswith(".wait") else self._handle(method, params, query, body),
            )
        except ApiError as e:
            status, payload = e.status, e.body
        with self._lock:
            self._calls.append(Call(method, params.get("zone"), split.path, query, body, status))
        return status, payload

    def _handle(self, method: str, p: dict[str, str], query: dict[str, str], body: Any) -> Any:
        with self._lock:
            self._advance()
            fault = self._scope_and_fault(method, p)
            req = Req(p["project"], scope(p), p.get("name", ""), query, body or {}, fault)
            return getattr(self, "_" + method.replace(".", "_"))(req)

    def _wait(self, method: str, p: dict[str, str]) -> dict[str, Any]:
        """operations/{op}/wait: block until DONE or WAIT_S, then answer the operation as it is."""
        with self._lock:
            self._advance()
            self._scope_and_fault(method, p)
        deadline = time.monotonic() + self.WAIT_S
        while True:
            with self._lock:
                self._advance()
                op = self._op(scope(p), p["name"])
                if op["status"] == "DONE" or time.monotonic() >= deadline:
                    return op
            time.sleep(0.02)

    # -- operations ------------------------------------------------------------------------------------------------
    def _advance(self) -> None:
        """Apply everything whose time has come: finished operations, preemption steps, ended maintenance windows."""
        now = time.monotonic()
        for op in list(self._ops.values()):
            if op.body["status"] != "DONE":
                if now >= op.done_at:
                    self._finish(op)
                else:
                    op.body.update(status="RUNNING", progress=50)
        for (zone, name), life in list(self._lives.items()):
            inst = self._instances.get((zone, name))
            if life.stop_at is not None and now >= life.stop_at and inst is not None:
                inst["status"], life.stop_at = "STOPPING", None
                self._new_op(self.project, zone, "compute.instances.preempted", inst, user="system", system=True)
            if life.gone_at is not None and now >= life.gone_at and inst is not None:
                inst.update(status="TERMINATED", lastStopTimestamp=now_rfc3339())
                life.gone_at = None
                if life.delete:
                    self.remove(zone, name)
            if life.maintenance_until is not None and now >= life.maintenance_until:
                life.maintenance, life.maintenance_until = "NONE", None

    def _new_op(self, project: str, zone: str | None, op_type: str, target: dict[str, Any], *,
                fault: dict[str, Any] | None = None, on_done: Callable[[], Any] | None = None, user: str | None = None,
                system: bool = False) -> dict[str, Any]:  # fmt: skip
        """An Operation on `target`; DONE at once unless op_delay_s, and then `on_done` (unless `fault`) runs."""
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(7)[:13]}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
        where = zone if zone and zone.startswith("regions/") else f"zones/{zone}" if zone else "global"
        body = {"kind": "compute#operation", "id": gs.new_id(), "name": name, "operationType": op_type,
                "targetLink": target["selfLink"], "targetId": target["id"], "status": "PENDING", "progress": 0,
                "user": user or f"ddctl@{project}.iam.gserviceaccount.com", "insertTime": now_rfc3339(),
                "startTime": now_rfc3339(), "selfLink": f"{BASE}/projects/{project}/{where}/operations/{name}"}  # fmt: skip
        if zone and zone.startswith("regions/"):
            body["region"] = f"{BASE}/projects/{project}/{zone}"
        elif zone:
            body["zone"] = f"{BASE}/projects/{project}/zones/{zone}"
        op = Op(body, time.monotonic() + (0 if system else self.op_delay_s), on_done, fault)
        self._ops[(zone, name)] = op
        if system or self.op_delay_s <= 0:
            self._finish(op)
        return copy.deepcopy(body)

    def _finish(self, op: Op) -> None:
        op.body.update(status="DONE", progress=100, endTime=now_rfc3339())
        if op.error is not None:
            error = dict(op.error)
            status = error.pop("httpStatus")
            op.body.update(
                error={"errors": [error]}, httpErrorStatusCode=status, httpErrorMessage=http.HTTPStatus(status).phrase.upper()
            )
        elif op.on_done is not None:
            op.on_done()

    def _op(self, zone: str | None, name: str) -> dict[str, Any]:
        if (zone, name) not in self._ops:
            raise not_found(f"projects/{self.project}/{f'zones/{zone}' if zone else 'global'}/operations/{name}")
        return copy.deepcopy(self._ops[(zone, name)].body)

    def _zoneOperations_get(self, r: Req) -> dict[str, Any]:
        return self._op(r.zone, r.name)

    def _zoneOperations_delete(self, r: Req) -> dict[str, Any]:
        self._op(r.zone, r.name)
        del self._ops[(r.zone, r.name)]
        return {}

    def _zoneOperations_list(self, r: Req) -> dict[str, Any]:
        ops = [copy.deepcopy(o.body) for (z, _), o in self._ops.items() if z == r.zone]
        return self._list("compute#operationList", f"{'zones/' + r.zone if r.zone else 'global'}/operations", ops, r.query)

    _regionOperations_get = _zoneOperations_get
    _globalOperations_get, _globalOperations_delete, _globalOperations_list = (
        _zoneOperations_get,
        _zoneOperations_delete,
        _zoneOperations_list,
    )

    # -- instances -------------------------------------------------------------------------------------------------
    def _list(self, kind: str, where: str, items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
        keep = gs.compile_filter(query.get("filter"))
        chunk, token = gs.page([i for i in items if keep(i)], query)
        out: dict[str, Any] = {
            "kind": kind,
            "id": f"projects/{self.project}/{where}",
            "selfLink": f"{BASE}/projects/{self.project}/{where}",
        }
        return out | ({"items": chunk} if chunk else {}) | ({"nextPageToken": token} if token else {})

    def _get(self, r: Req) -> dict[str, Any]:
        if (r.zone, r.name) not in self._instances:
            raise not_found(f"projects/{self.project}/zones/{r.zone}/instances/{r.name}")
        return self._instances[(r.zone, r.name)]  # type: ignore[index]

    def _instances_get(self, r: Req) -> dict[str, Any]:
        return copy.deepcopy(self._get(r))

    def _instances_list(self, r: Req) -> dict[str, Any]:
        items = [copy.deepcopy(i) for (z, _), i in sorted(self._instances.items()) if z == r.zone]
        return self._list("compute#instanceList", f"zones/{r.zone}/instances", items, r.query)

    def _instances_aggregatedList(self, r: Req) -> dict[str, Any]:
        """items keyed "zones/Z": {instances} or, as Google does for an empty scope, a NO_RESULTS_ON_PAGE warning."""
        flat = self._list("compute#instanceAggregatedList", "aggregated/instances", self.instances(), r.query)
        found = {z: [i for i in flat.get("items", []) if i["zone"].endswith(f"/zones/{z}")] for z in sorted(self._region)}
        return flat | {"items": {f"zones/{z}": {"instances": i} if i else gs.no_results(f"zones/{z}") for z, i in found.items()}}

    def _instances_insert(self, r: Req) -> dict[str, Any]:
        inst = gs.new_instance(r.body, r.project, r.zone)  # type: ignore[arg-type]
        key = (r.zone, inst["name"])
        if key in self._instances:
            raise ApiError(
                409,
                f"The resource 'projects/{r.project}/zones/{r.zone}/instances/{inst['name']}' already exists",
                "alreadyExists",
            )
        if r.fault is None:  # a failed insert makes nothing and uses no address
            gs.wire_instance(inst, self._region[r.zone], self._nat, self._internal)  # type: ignore[index]
            self._instances[key], self._lives[key] = inst, Life()  # type: ignore[index]

        def running() -> None:
            if key in self._instances:
                self._instances[key].update(status="RUNNING", lastStartTimestamp=now_rfc3339())

        return self._new_op(r.project, r.zone, "insert", inst, fault=r.fault, on_done=running)

    def _instances_delete(self, r: Req) -> dict[str, Any]:
        inst = self._get(r)
        if r.fault is None:
            inst["status"] = "STOPPING"
        return self._new_op(r.project, r.zone, "delete", inst, fault=r.fault, on_done=lambda: self.remove(r.zone, r.name))  # type: ignore[arg-type]

    def _instances_simulateMaintenanceEvent(self, r: Req) -> dict[str, Any]:
        """SPOT: a preemption (preempted now; STOPPING after the notice, then TERMINATED or deleted). Else: an event."""
        inst, life = self._get(r), self._lives.setdefault((r.zone, r.name), Life())  # type: ignore[arg-type]
        if r.fault is None:
            now, sched = time.monotonic(), inst["scheduling"]
            if sched.get("provisioningModel") == "SPOT" or sched.get("preemptible"):
                life.preempted, life.delete = True, sched.get("instanceTerminationAction") == "DELETE"
                life.stop_at = now + self.preempt_notice_s
                life.gone_at = life.stop_at + min(1.0, self.preempt_notice_s / 4)
            else:
                life.maintenance = f"{sched.get('onHostMaintenance', 'MIGRATE')}_ON_HOST_MAINTENANCE"
                life.maintenance_until = now + self.preempt_notice_s
        return self._new_op(r.project, r.zone, "simulateMaintenanceEvent", inst, fault=r.fault)

    def _instances_setLabels(self, r: Req) -> dict[str, Any]:
        inst, labels = self._get(r), r.body.get("labels") or {}
        if r.body.get("labelFingerprint") != inst["labelFingerprint"]:
            raise ApiError(412, "Labels fingerprint either invalid or resource labels have changed", "conditionNotMet")
        gs.check_labels(labels)
        return self._new_op(r.project, r.zone, "setLabels", inst, fault=r.fault,
                            on_done=lambda: inst.update(labels=labels, labelFingerprint=fingerprint(labels)))  # fmt: skip

    def _instances_setMetadata(self, r: Req) -> dict[str, Any]:
        inst, items = self._get(r), r.body.get("items") or []
        if r.body.get("fingerprint") != inst["metadata"]["fingerprint"]:
            raise ApiError(412, "Supplied fingerprint does not match current metadata fingerprint.", "conditionNotMet")
        new = {"kind": "compute#metadata", "fingerprint": fingerprint(items)} | ({"items": items} if items else {})
        return self._new_op(r.project, r.zone, "setMetadata", inst, fault=r.fault, on_done=lambda: inst.update(metadata=new))


class _Handler(BaseHTTPRequestHandler):
    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        status, payload = self.server.owner._dispatch(self.command, self.path, self.rfile.read(length))  # type: ignore[attr-defined]
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one stderr line per request drowns test output
