"""An offline AWS for tests: moto's server on a real HTTP port, behind a fault layer that says no the way AWS does.

Code under test talks to it through plain boto3 (`AWS_ENDPOINT_URL`), in this process or a subprocess, so what is
tested is the real request/response/retry path, not a mock of it. Faults and canned answers are set in-process.
"""

from __future__ import annotations

import contextlib
import functools
import io
import ipaddress
import json
import os
import re
import shutil
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

import boto3
import botocore.session
from botocore.config import Config
from moto.ec2 import utils as ec2_utils
from moto.ec2.models import elastic_ip_addresses, elastic_network_interfaces
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.serving import make_server
from werkzeug.wsgi import get_input_stream

#: Instance public IPs and Elastic IPs come from here, so a test "hypervisor" can put containers at those addresses.
PUBLIC_POOL = ipaddress.IPv4Network("100.100.0.0/16")

#: The HTTP status EC2 really uses per error code (capacity errors are 500s, which is why botocore retries them).
STATUS = {
    "InsufficientInstanceCapacity": 500, "SpotMaxPriceTooLow": 400, "Unsupported": 400, "MaxSpotInstanceCountExceeded": 400,
    "VcpuLimitExceeded": 400, "InvalidParameterValue": 400, "AuthFailure": 401, "UnauthorizedOperation": 403,
    "RequestLimitExceeded": 503, "InternalError": 500, "Unavailable": 503,
}  # fmt: skip
_MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient {type} capacity in the Availability Zone you requested "
    "({zone}). Our system will be working on provisioning additional capacity. You can currently get {type} capacity by not "
    "specifying an Availability Zone in your request or choosing a different Availability Zone.",
    "Unsupported": "Your requested instance type ({type}) is not supported in your requested Availability Zone ({zone}). "
    "Please retry your request by not specifying an Availability Zone or choosing a different Availability Zone.",
    "SpotMaxPriceTooLow": "Your Spot request price is lower than the minimum required Spot request fulfillment price for {type}.",
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit allows for the instance bucket "
    "that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an "
    "adjustment to this limit.",
    "AuthFailure": "AWS was not able to validate the provided access credentials",
    "UnauthorizedOperation": "You are not authorized to perform this operation.",
    "RequestLimitExceeded": "Request limit exceeded.",
    "InternalError": "An internal error has occurred",
    "Unavailable": "The service is unavailable. Please try again shortly.",
}
_SCOPE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_JSON = "application/x-amz-json-1.1"


@dataclass(frozen=True)
class Call:
    """One request as the fault layer saw it; `faulted` means a fail() rule answered instead of moto."""

    service: str
    action: str
    region: str | None
    zone: str | None
    status: int
    faulted: bool
    params: dict[str, Any]


@dataclass
class _Rule:
    action: str
    status: int
    code: str | None  # an error code for fail(); None for a canned answer()
    body: str
    region: str | None = None
    zone: str | None = None
    match: dict[str, Any] = field(default_factory=dict)
    times: int | None = None

    def applies(self, call: Call) -> bool:
        return (
            self.action == call.action
            and self.region in (None, call.region)
            and self.zone in (None, call.zone)
            and all(call.params.get(k) == v for k, v in self.match.items())
        )


@functools.cache
def _rest_routes(service: str) -> list[tuple[str, re.Pattern[str], str]]:
    """(method, path pattern, operation) for a REST service, most specific first, from botocore's own model."""
    try:
        model = botocore.session.get_session().get_service_model(service)
    except Exception:
        return []
    routes = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        parts = re.split(r"(\{[^}]+\})", http["requestUri"].split("?")[0])
        regex = "".join((".+" if p.endswith("+}") else "[^/]+") if p.startswith("{") else re.escape(p) for p in parts)
        routes.append((len("".join(parts[::2])), http["method"], re.compile(regex), name))
    return [(method, regex, name) for _, method, regex, name in sorted(routes, key=lambda r: -r[0])]


class _QuietHandler(MotoRequestHandler):
    def log_request(self, *args: Any) -> None:
        pass  # one stderr line per request drowns test output; errors are still logged


def _fresh_addresses() -> Iterator[str]:
    gateway = PUBLIC_POOL.network_address + 1  # the Docker bridge gateway
    return (str(a) for a in PUBLIC_POOL.hosts() if a != gateway)


class AwsCloud:
    """moto in server mode on 127.0.0.1:<free port>, with fail()/answer() rules and a call log in front of it.

    moto's state and the address patch are process-wide: run one at a time (stop() undoes the patch, nested ones LIFO).
    """

    _PATCHED: tuple[tuple[ModuleType, str], ...] = (
        (ec2_utils, "random_ip"),
        (ec2_utils, "random_public_ip"),
        (elastic_ip_addresses, "random_ip"),
        (elastic_network_interfaces, "random_public_ip"),
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._calls: list[Call] = []
        self._addresses = _fresh_addresses()
        self._dir = tempfile.mkdtemp(prefix="aws-cloud-")
        with open(os.path.join(self._dir, "config"), "w") as f:
            f.write("[default]\nregion = us-east-1\n")  # AWS_PROFILE=default must name a profile that exists
        open(os.path.join(self._dir, "credentials"), "w").close()
        core = botocore.session.Session()  # its own files and profile: the env() a test sets later must not confuse it
        for variable, value in (("config_file", "config"), ("credentials_file", "credentials")):
            core.set_config_variable(variable, os.path.join(self._dir, value))
        core.set_config_variable("profile", "default")
        self._session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", botocore_session=core)
        self._moto = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True, request_handler=_QuietHandler)
        self._saved = [(module, name, getattr(module, name)) for module, name in self._PATCHED]
        for module, name in self._PATCHED:
            setattr(module, name, self._next_address)
        self._thread = threading.Thread(target=self._server.serve_forever, name="aws-cloud", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def env(self) -> dict[str, str]:
        """Variables that point boto3 here and nowhere real (callers must still drop any AWS_ENDPOINT_URL_<SERVICE>)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "false",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_SECURITY_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_PROFILE": "default",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.path.join(self._dir, "config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self._dir, "credentials"),
        }

    def client(self, service: str, region: str = "us-east-1", config: Config | None = None) -> Any:
        """A boto3 client for assertions; one shared session, since loading service models costs ~0.3 s a session."""
        with self._lock:
            return self._session.client(service, region, endpoint_url=self.endpoint, config=config)

    def fail(
        self,
        action: str,
        code: str,
        *,
        status: int | None = None,
        message: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        times: int | None = None,
    ) -> None:
        """Answer `action` with AWS error `code` (at EC2's real HTTP status) `times` times, or until clear()."""
        rule = _Rule(action, status or STATUS.get(code, 400), code, message or "", region, zone, times=times)
        with self._lock:
            self._rules.append(rule)

    def answer(
        self,
        action: str,
        body: str | dict[str, Any],
        *,
        status: int = 200,
        region: str | None = None,
        match: dict[str, Any] | None = None,
        times: int | None = None,
    ) -> None:
        """A canned answer for a call moto gets wrong; `match` narrows it to calls with those params."""
        text = body if isinstance(body, str) else json.dumps(body)
        with self._lock:
            self._rules.append(_Rule(action, status, None, text, region, match=match or {}, times=times))

    def answer_quota(self, quota_code: str, value: float, region: str | None = None, name: str | None = None) -> None:
        """Service Quotas' GetServiceQuota for an EC2 quota such as spot vCPUs (moto only knows VPC quotas)."""
        arn = f"arn:aws:servicequotas:{region or 'us-east-1'}:123456789012:ec2/{quota_code}"
        quota = {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)", "QuotaArn": arn,
                 "QuotaCode": quota_code, "QuotaName": name or f"EC2 quota {quota_code}", "Value": float(value), "Unit": "None",
                 "Adjustable": True, "GlobalQuota": False}  # fmt: skip
        self.answer("GetServiceQuota", {"Quota": quota}, region=region, match={"ServiceCode": "ec2", "QuotaCode": quota_code})

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def calls(self, action: str | None = None, region: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self._calls if action in (None, c.action) and region in (None, c.region)]

    def reset(self) -> None:
        """Wipe moto's state (all of it: backends are process-wide), the rules and the log; addresses are never reused."""
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        no_proxy.open(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=30).close()
        with self._lock:
            self._rules.clear()
            self._calls.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        for module, name, original in self._saved:
            setattr(module, name, original)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> AwsCloud:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_address(self) -> str:
        with self._lock:
            return next(self._addresses)

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        """Read the call, then answer it from the newest matching rule or pass it to moto; log it either way."""
        if environ.get("PATH_INFO", "").startswith("/moto-api"):
            return self._moto(environ, start_response)
        body = get_input_stream(environ).read()
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        query = environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded")
        call = _describe(environ, body, query)
        with self._lock:
            rule = next((r for r in reversed(self._rules) if r.applies(call)), None)
            if rule is not None and rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    self._rules.remove(rule)
        seen: list[int] = []
        if rule is None:

            def recording(status: str, headers: Any, exc_info: Any = None) -> Any:
                seen.append(int(status.split()[0]))
                return start_response(status, headers, exc_info)

            result = self._moto(environ, recording)
        else:
            headers, payload = _render(rule, call, query)
            start_response(f"{rule.status} {HTTP_STATUS_CODES.get(rule.status, 'Error')}", headers)
            seen, result = [rule.status], [payload.encode()]
        with self._lock:
            self._calls.append(replace(call, status=seen[0] if seen else 0, faulted=rule is not None and rule.code is not None))
        return result


def _describe(environ: dict[str, Any], body: bytes, query: bool) -> Call:
    """Service and region from the SigV4 credential scope; action from Action=, X-Amz-Target or the REST route."""
    scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
    akid, region, service = scope.groups() if scope else ("", None, "")
    if not query:
        params = json.loads(body) if body.startswith(b"{") else {}
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        routes = _rest_routes(service) if not target else []
        action = next((n for m, regex, n in routes if m == method and regex.fullmatch(path)), f"{method} {path}")
        return Call(service, target.rpartition(".")[2] if target else action, region, None, 0, False, params)
    form = parse_qsl(environ.get("QUERY_STRING", "")) + parse_qsl(body.decode())
    params = {k: v if len(v) <= 200 else v[:200] + "..." for k, v in form}
    zone = next((v for k, v in params.items() if k.endswith("AvailabilityZone")), None)
    subnet = next((v for k, v in params.items() if k.endswith("SubnetId")), None)
    if zone is None and subnet:
        from moto.ec2.models import ec2_backends
        from moto.iam.models import get_account_id_from

        account = os.environ.get("MOTO_ACCOUNT_ID") or environ.get("HTTP_X_MOTO_ACCOUNT_ID") or get_account_id_from(akid)
        with contextlib.suppress(Exception):
            zone = str(ec2_backends[account][region or "us-east-1"].get_subnet(subnet).availability_zone)
    return Call(service, params.get("Action", ""), region, zone, 0, False, params)


def _render(rule: _Rule, call: Call, query: bool) -> tuple[list[tuple[str, str]], str]:
    """Headers and body of a canned answer, or of an error shaped like the protocol's real ones."""
    rid = str(uuid.uuid4())
    if rule.code is None:
        return [("Content-Type", "text/xml" if rule.body.startswith("<") else _JSON), ("x-amzn-RequestId", rid)], rule.body
    kind = {"type": call.params.get("InstanceType", "the requested instance type"), "zone": call.zone or call.region or "?"}
    message = rule.body or _MESSAGES.get(rule.code, "{code} (injected by the test cloud)").format(code=rule.code, **kind)
    if not query:
        headers = [("Content-Type", _JSON), ("x-amzn-ErrorType", rule.code), ("x-amzn-RequestId", rid)]
        return headers, json.dumps({"__type": rule.code, "message": message})
    error = f"<Code>{rule.code}</Code><Message>{escape(message)}</Message>"
    if call.service == "ec2":
        body = f"<Response><Errors><Error>{error}</Error></Errors><RequestID>{rid}</RequestID></Response>"
    else:
        body = f"<ErrorResponse><Error><Type>Sender</Type>{error}</Error><RequestId>{rid}</RequestId></ErrorResponse>"
    return [("Content-Type", "text/xml")], f'<?xml version="1.0" encoding="UTF-8"?>\n{body}'
