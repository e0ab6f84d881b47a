"""What Compute Engine answers to ddctl's reads is checked before it is acted on (found by an audit of the gcp provider):
a refused list or get (401, 403, 429, 5xx, a retry that ran out, a dropped connection) is the provider's classified
``ProvisionError`` naming what was read, where and in which project, so ``ddctl down``, ``ddctl ls`` and
``down --orphans`` end with ``ddctl: error: ...`` and exit 7, not a google.api_core traceback; a 404 stays "gone"; an
instance listed without a name or zone of GCE's patterns is skipped, one without its zone URL takes the list's key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1
from typer.testing import CliRunner

from builders import machines_that_would_answer
from ddctl.cli.app import app
from ddctl.cli.errors import EXIT_PROVISION
from ddctl.config.regions import Region
from ddctl.control.rundir import RunDir
from ddctl.control.state import State
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers.base import Instance, InstanceSpec
from ddctl.providers.gcp import network
from ddctl.providers.gcp import provider as gcp_provider
from ddctl.providers.gcp.clients import Clients
from ddctl.providers.gcp.orphans import expired, orphaned
from ddctl.providers.gcp.provider import GcpProvider
from gcp_cloud import GcpCloud

RUN, PROJECT, ZONE = "r1", "p1", "us-central1-a"
IOWA = Region(name="iowa", provider="gcp", cloud_region="us-central1", instance_type="g2-standard-4", project=PROJECT)
REFUSALS = [
    (exceptions.Unauthorized("Request had invalid authentication credentials.", errors=[{"reason": "authError"}]),
     "authError", "credentials"),
    (exceptions.Forbidden("Required 'compute.instances.list' permission for 'projects/p1'", errors=[{"reason": "forbidden"}]),
     "forbidden", "credentials"),
    (exceptions.TooManyRequests("Rate Limit Exceeded", errors=[{"reason": "rateLimitExceeded"}]), "rateLimitExceeded",
     "transient"),
    (exceptions.InternalServerError("Internal error", errors=[{"reason": "backendError"}]), "backendError", "transient"),
    (exceptions.RetryError("Timeout of 30.0s exceeded", cause=exceptions.ServiceUnavailable("503")), "RetryError",
     "transient"),
    (ConnectionError("Connection reset by peer"), "ConnectionError", "transient"),
]  # fmt: skip


def vm(name: str = "ddctl-r1-l0-abc123", zone: str | None = ZONE, **extra: Any) -> compute_v1.Instance:
    """An instance as the library parses GCE's JSON (fields GCE leaves out read as defaults)."""
    body: dict[str, Any] = {"name": name, "status": "RUNNING", "labels": {"ddctl-run": RUN}} | extra
    body.setdefault("metadata", {"items": [{"key": "ddctl-run", "value": RUN}, {"key": "ddctl-name", "value": "L0"}]})
    if zone is not None:
        body["zone"] = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}"
    return compute_v1.Instance.from_json(json.dumps(body))


class Refusing:
    """A compute_v1 client whose every call is refused with ``error``; a listing's first page comes, the next is refused
    (the pager reads it while iterated)."""

    def __init__(self, error: Exception, listed: list[tuple[str, Any]] | None = None) -> None:
        self.error, self.listed = error, listed

    def aggregated_list(self, **_: Any) -> Iterator[tuple[str, Any]]:
        if self.listed is not None:  # GCE answers: the pages as given
            yield from self.listed
            return
        yield "zones/us-central1-b", compute_v1.InstancesScopedList(instances=[vm(zone="us-central1-b")])
        raise self.error

    def __getattr__(self, method: str) -> Any:
        def refused(*_: Any, **__: Any) -> Any:
            raise self.error

        return refused


class Empty:
    """A compute_v1 client with nothing to list."""

    def list(self, **_: Any) -> list[Any]:
        return []


class Answering(Clients):
    """Clients whose InstancesClient answers as a test says and every other client refuses as it does (or lists nothing)."""

    def __init__(self, instances: Refusing, others: Any = None) -> None:
        super().__init__()
        self.instances, self.others = instances, others or Refusing(instances.error)

    def client(self, name: str) -> Any:
        return self.instances if name == "InstancesClient" else self.others


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The run made something in PROJECT (its footprint names the project), in a home of its own."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DDCTL_SSH_FROM", "100.100.0.1/32")
    monkeypatch.delenv("DDCTL_GCP_ENDPOINT", raising=False)
    network.remember(RUN, PROJECT, "us-central1")


def refusal(action: Any) -> ProvisionError:
    with pytest.raises(ProvisionError) as refused:
        action()
    return refused.value


@pytest.mark.usefixtures("home")
@pytest.mark.parametrize(("error", "code", "kind"), REFUSALS, ids=[type(e).__name__ for e, _, _ in REFUSALS])
def test_every_refused_read_of_down_ls_and_the_sweep_is_a_provision_error_saying_what_and_where(
    error: Exception, code: str, kind: str
) -> None:
    provider = GcpProvider(Answering(Refusing(error)))
    instance = Instance(name="L0", provider_id=f"{ZONE}/ddctl-r1-l0-abc123", run=RUN, alive=True, address="", zone=ZONE)
    what = {
        "listing the instances of run r1 in project p1": lambda: provider.list_run(RUN),
        "listing ddctl's instances in project p1": lambda: provider.sweep([IOWA], live=set(), now=0.0),
        "reading instance ddctl-r1-l0-abc123 in project p1": lambda: provider.terminate(instance, grace_s=1.0),
        "removing the network of run r1 in project p1": lambda: provider.cleanup(RUN),
        "admitting learners to the syncer of run r1 in project p1": lambda: provider.admit(RUN, {"L0": "100.64.0.9"}),
    }
    for doing, action in what.items():
        refused = refusal(action)
        assert (refused.provider, refused.code, refused.kind) == ("gcp", code, kind), doing
        assert f": {doing}: {code}: " in str(refused) and getattr(error, "message", str(error)) in str(refused), refused
        if kind == "credentials":
            assert "(credentials: Application Default Credentials" in str(refused)
    refused = refusal(lambda: provider.ssh_target(instance))
    assert refused.zone == ZONE and refused.region == "us-central1" and str(refused).startswith(f"gcp in {ZONE}: reading")


@pytest.mark.usefixtures("home")
def test_a_404_is_gone_not_a_refusal_and_an_orphan_gone_since_the_listing_is_passed_over() -> None:
    gone = exceptions.NotFound("The resource 'projects/p1/zones/us-central1-a/instances/x' was not found")
    orphan = vm(labels={"ddctl-run": "dead"}, metadata={"items": [{"key": "ddctl-run", "value": "dead"}]})
    listed = [(f"zones/{ZONE}", compute_v1.InstancesScopedList(instances=[orphan]))]
    provider = GcpProvider(Answering(Refusing(gone, listed), Empty()))
    instance = Instance(name="L0", provider_id=f"{ZONE}/ddctl-r1-l0-abc123", run=RUN, alive=True, address="", zone=ZONE)
    with pytest.raises(DdctlError, match="L0 is not running") as not_running:
        provider.ssh_target(instance)
    assert not isinstance(not_running.value, ProvisionError)
    provider.terminate(instance, grace_s=1.0)  # gone already: nothing to wait for, and its delete's 404 is fine
    assert provider.sweep([IOWA], live=set(), now=0.0) == []  # the orphan's delete said 404: gone already, passed over


@pytest.mark.usefixtures("home")
def test_listed_instances_of_another_shape_are_skipped_and_a_missing_zone_is_read_from_the_lists_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plain = vm(networkInterfaces=[{"networkIP": "10.128.0.2", "accessConfigs": [{"natIP": "34.1.2.3"}]}])
    bare = vm("ddctl-r1-l1-abc123", zone=None, metadata={"items": [{"key": "ddctl-run", "value": RUN}, {"key": "x"}]})
    odd = [
        vm(""),  # no name
        vm("ddctl-r1-l2\n2026-05-01 INFO forged"),  # not a name GCE gives: a log line, a URL, a provider id
        vm("ddctl-r1-l3-abc123", zone="../../global"),  # a zone URL of another shape
        vm("ddctl-r1-l4-abc123", zone=None),  # no zone URL, under a key that names no zone
    ]
    pages = [
        (f"zones/{ZONE}", compute_v1.InstancesScopedList(instances=[plain, bare, *odd[:3]])),
        ("regions/us-central1", compute_v1.InstancesScopedList(instances=[odd[3]])),
        ("zones/us-central1-c", compute_v1.InstancesScopedList()),  # GCE's warning "no results" scope: no instances
    ]
    provider = GcpProvider(Answering(Refusing(RuntimeError("not called"), pages)))
    listed = {i.provider_id: i for i in provider.list_run(RUN)}
    assert sorted(listed) == [f"{ZONE}/ddctl-r1-l0-abc123", f"{ZONE}/ddctl-r1-l1-abc123"]
    first, second = listed[f"{ZONE}/ddctl-r1-l0-abc123"], listed[f"{ZONE}/ddctl-r1-l1-abc123"]
    assert (first.name, first.address, first.private_address, first.zone, first.alive) == ("L0", "34.1.2.3", "10.128.0.2",
                                                                                             ZONE, True)  # fmt: skip
    assert (second.name, second.address, second.private_address, second.zone) == ("?", "", "", ZONE)
    assert sum("GCE listed an instance of another shape: skipped" in m for m in caplog.messages) == len(odd)


def test_an_expiry_label_of_unicode_digits_is_unreadable_not_a_crash() -> None:
    """GCE label values may be any lowercase Unicode: ``"²".isdigit()`` is true, ``int("²")`` a ValueError."""
    assert not expired({"ddctl-expires-at": "²"}, 10.0) and not expired({"ddctl-expires-at": "١٢"}, 10.0**12)
    kept = vm(labels={"ddctl-run": "live", "ddctl-expires-at": "²"}, metadata={"items": [{"key": "ddctl-run", "value": "live"}]})
    assert orphaned([kept], {"live"}, now=10.0**12) == []


def run_of_record(gcp: GcpCloud) -> None:
    """A gcp run this machine has a record of, whose footprint names the fake's project."""
    network.remember(RUN, gcp.project, "us-central1")
    with State() as state:
        state.create_run(RUN, "regions.yaml", "job", {"kinds": {"iowa": "gcp"}})


def clean_exit(result: Any, *expected: str) -> None:
    assert result.exit_code == EXIT_PROVISION, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    line = result.stderr.strip()
    assert line.startswith("ddctl: error: gcp") and "\n" not in line, line
    for part in expected:
        assert part in line, line


@pytest.mark.parametrize("argv", [["down", "--run", RUN], ["ls"]])
def test_down_and_ls_end_with_a_clear_error_when_gce_refuses_the_listing(gcp: GcpCloud, argv: list[str]) -> None:
    run_of_record(gcp)
    gcp.fail("instances.aggregatedList", status=403, reason="forbidden", times=None)
    clean_exit(CliRunner().invoke(app, argv), f"listing the instances of run {RUN} in project {gcp.project}: forbidden: ",
               "Required 'compute.", f"(credentials: anonymous, against DDCTL_GCP_ENDPOINT={gcp.endpoint})")  # fmt: skip


def test_down_ends_with_a_clear_error_when_gce_refuses_to_read_an_instance(
    gcp: GcpCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    machines_that_would_answer(monkeypatch, gcp_provider)
    run_of_record(gcp)
    infos = GcpProvider().bootstrap(RUN, [IOWA.model_copy(update={"project": ""})], "iowa")
    made = GcpProvider().create(
        InstanceSpec(run=RUN, name="L0", region="iowa", role="learner", argv=("x",), log=RunDir(RUN).log("L0"),
                     cloud_region="us-central1", zone=ZONE, machine=infos["iowa"].machine)
    )  # fmt: skip
    gcp.fail("instances.get", status=403, reason="forbidden", times=None)
    vm_name = made.provider_id.split("/")[1]
    clean_exit(CliRunner().invoke(app, ["down", "--run", RUN]),
               f"gcp in {ZONE}: reading instance {vm_name} in project {gcp.project}: forbidden: ")  # fmt: skip
    assert len(gcp.instances()) == 1  # nothing was deleted on a guess


def test_down_orphans_ends_with_a_clear_error_when_gce_refuses_the_listing(gcp: GcpCloud, tmp_path: Path) -> None:
    regions = tmp_path / "regions.yaml"
    regions.write_text("run: other\nsyncer: iowa\nregions:\n"
                       "  - {name: iowa, provider: gcp, cloud_region: us-central1, instance_type: g2-standard-4}\n")  # fmt: skip
    api_off = "Compute Engine API has not been used in project ddctl-test before or it is disabled."
    gcp.fail("instances.aggregatedList", status=403, reason="accessNotConfigured", message=api_off, times=None)
    clean_exit(CliRunner().invoke(app, ["down", "--orphans", "-f", str(regions)]),
               f"gcp: listing ddctl's instances in project {gcp.project}: accessNotConfigured: ", api_off)  # fmt: skip


def test_a_refused_rewrite_of_the_syncers_port_names_the_run_and_project(gcp: GcpCloud) -> None:
    provider = GcpProvider()
    provider.bootstrap(RUN, [IOWA.model_copy(update={"project": ""})], "iowa")
    gcp.fail("firewalls.patch", status=403, reason="forbidden", times=None)
    refused = refusal(lambda: provider.admit(RUN, {"L0": "100.64.0.9"}))
    assert refused.kind == "credentials" and refused.code == "forbidden"
    assert f"gcp: admitting learners to the syncer of run {RUN} in project {gcp.project}: forbidden: " in str(refused)
    (syncer,) = [rule for rule in gcp.firewalls() if rule["name"] == "ddctl-r1-syncer"]
    assert syncer["sourceRanges"] == ["100.100.0.1/32"]  # the operator alone, as before the refused patch
