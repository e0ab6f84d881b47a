"""The Compute Engine fake's faults, driven by the real google-cloud-compute REST clients: Google's error bodies and
statuses as the client raises them, zone-scoped faults, retried reads, failed operations and recorded error shapes."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as gexc

from gcp_cloud import GcpCloud
from gcp_shapes import (
    GPUS_ALL_REGIONS,
    PREEMPTIBLE_QUOTA_EXCEEDED_REGION,
    QUOTA_EXCEEDED_REGION,
    UNSUPPORTED_OPERATION,
    ZONE_EXHAUSTED,
)  # fmt: skip
from tests.gcp_fake_harness import DONE, ZONE, _fresh, clients, cloud, create, vm  # noqa: F401 - the fixtures


def test_fail_answers_googles_error_body_and_the_reason_is_in_errors(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    cloud.fail("instances.insert", zone=ZONE)
    with pytest.raises(gexc.Forbidden) as caught:
        create(clients, cloud, vm("a"))
    exc = caught.value
    assert exc.code == 403 and exc.errors[0]["reason"] == "quotaExceeded" and exc.errors[0]["domain"] == "usageLimits"
    assert exc.response.json()["error"]["status"] == "PERMISSION_DENIED"
    assert exc.reason is None  # only a google.rpc.ErrorInfo detail fills exc.reason
    assert cloud.instances() == [] and [c.status for c in cloud.calls("instances.insert")] == [403]
    create(clients, cloud, vm("a"))  # times=1 is used up
    cloud.fail("instances.insert", status=429, reason="rateLimitExceeded", error_info={"reason": "RATE_LIMIT_EXCEEDED",
               "domain": "googleapis.com", "metadata": {"service": "compute.googleapis.com"}})  # fmt: skip
    with pytest.raises(gexc.TooManyRequests) as limited:
        create(clients, cloud, vm("b"))
    assert limited.value.reason == "RATE_LIMIT_EXCEEDED" and limited.value.domain == "googleapis.com"


def test_a_zone_scoped_fault_leaves_other_zones_alone(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    cloud.fail("instances.insert", zone="us-central1-b", times=None)
    create(clients, cloud, vm("a"))
    for _ in range(2):
        with pytest.raises(gexc.Forbidden):
            create(clients, cloud, vm("b", "us-central1-b"), "us-central1-b")
    assert [c.status for c in cloud.calls("instances.insert", zone="us-central1-b")] == [403, 403]


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, gexc.BadRequest), (404, gexc.NotFound), (409, gexc.Conflict), (412, gexc.PreconditionFailed),
     (429, gexc.TooManyRequests), (500, gexc.InternalServerError), (503, gexc.ServiceUnavailable)],
)  # fmt: skip
def test_each_http_status_maps_to_its_api_core_exception(
    cloud: GcpCloud, clients: dict[str, Any], status: int, error: type[gexc.GoogleAPICallError]
) -> None:
    cloud.fail("instances.insert", status=status, reason="backendError")
    with pytest.raises(error) as caught:
        create(clients, cloud, vm("a"))
    assert caught.value.code == status and caught.value.errors[0]["reason"] == "backendError"


def test_reads_retry_a_503_by_themselves_but_inserts_do_not(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    create(clients, cloud, vm("a"))
    cloud.fail("instances.get", status=503, reason="backendError", times=2)
    assert clients["Instances"].get(project=cloud.project, zone=ZONE, instance="a", timeout=5).name == "a"
    assert [c.status for c in cloud.calls("instances.get")] == [503, 503, 200]
    cloud.fail("instances.insert", status=503, reason="backendError")
    with pytest.raises(gexc.ServiceUnavailable):
        create(clients, cloud, vm("b"))
    assert [c.status for c in cloud.calls("instances.insert")] == [200, 503]


def test_fail_operation_ends_the_operation_with_an_error_and_makes_nothing(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    cloud.fail_operation("instances.insert")
    op = create(clients, cloud, vm("a"))
    assert op.status == DONE and op.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert f"'projects/{cloud.project}/zones/{ZONE}' does not have enough resources" in op.error.errors[0].message
    assert op.http_error_status_code == 503 and op.http_error_message == "SERVICE UNAVAILABLE"
    assert cloud.instances() == [] and cloud.calls("instances.insert")[0].status == 200
    assert create(clients, cloud, vm("a")).error.errors == []  # times=1 is used up
    cloud.fail_operation("instances.delete", **ZONE_EXHAUSTED)
    op = clients["Instances"].delete_unary(project=cloud.project, zone=ZONE, instance="a", timeout=5)
    waited = clients["ZoneOperations"].wait(project=cloud.project, zone=ZONE, operation=op.name, timeout=5)
    assert waited.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" and cloud.instance(ZONE, "a") is not None


@pytest.mark.parametrize("shape", [ZONE_EXHAUSTED, GPUS_ALL_REGIONS, QUOTA_EXCEEDED_REGION, PREEMPTIBLE_QUOTA_EXCEEDED_REGION,
                                   UNSUPPORTED_OPERATION])  # fmt: skip
def test_recorded_error_shapes_arrive_whole_through_the_client(
    cloud: GcpCloud, clients: dict[str, Any], shape: dict[str, Any]
) -> None:
    cloud.fail_operation("instances.insert", shape, zone="europe-west4-a")
    op = create(clients, cloud, vm("a", "europe-west4-a"), "europe-west4-a")
    error = op.error.errors[0]
    assert error.code == shape["code"] and "{" not in error.message and len(error.error_details) == len(shape["errorDetails"])
    assert op.http_error_status_code == {"QUOTA_EXCEEDED": 403, "UNSUPPORTED_OPERATION": 400}.get(shape["code"], 503)
    for detail in error.error_details:
        if "quota_info" in detail:
            assert detail.quota_info.metric_name.startswith("compute.googleapis.com/") and detail.quota_info.limit == 0
            assert dict(detail.quota_info.dimensions) in ({"global": "global"}, {"region": "europe-west4"})
        if "error_info" in detail:
            assert dict(detail.error_info.metadatas) == {"vmType": "g2-standard-4", "zone": "europe-west4-a",
                                                         "zonesAvailable": "europe-west4-b"}  # fmt: skip
