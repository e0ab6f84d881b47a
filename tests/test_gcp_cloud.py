"""The Compute Engine fake, driven by the real google-cloud-compute REST clients: what ddctl's GCP provider will rely on."""

from __future__ import annotations

import ipaddress
import threading
import time
from typing import Any

import httpx
import pytest
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from ddctl_agents.waiting import wait_until
from gcp_cloud import GcpCloud
from gcp_shapes import NAT_POOL
from tests.gcp_fake_harness import DONE, ZONE, _fresh, clients, cloud, create, live, vm  # noqa: F401 - the fixtures


def test_insert_then_wait_reaches_done_and_the_instance_runs_with_a_nat_ip(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    op = create(clients, cloud, vm("a", labels={"run": "r1"}))
    assert op.status == DONE and op.progress == 100 and not op.error.errors
    assert op.operation_type == "insert" and op.target_link.endswith(f"/zones/{ZONE}/instances/a")
    got = clients["Instances"].get(project=cloud.project, zone=ZONE, instance="a", timeout=5)
    assert got.status == "RUNNING" and got.id == op.target_id
    nat = got.network_interfaces[0].access_configs[0].nat_i_p
    assert ipaddress.ip_address(nat) in NAT_POOL and cloud.address_of(nat) == (ZONE, "a")
    assert got.network_interfaces[0].network_i_p.startswith("10.128.")
    assert (
        got.machine_type
        == f"https://www.googleapis.com/compute/v1/projects/{cloud.project}/zones/{ZONE}/machineTypes/n2-standard-4"
    )
    assert got.scheduling.automatic_restart and got.scheduling.on_host_maintenance == "MIGRATE"
    create(clients, cloud, vm("b", nat=False))
    assert not live(cloud, "b")["networkInterfaces"][0].get("accessConfigs")


def test_a_delayed_operation_is_pending_then_done_and_wait_blocks_until_then() -> None:
    with GcpCloud(op_delay_s=1.0) as slow:  # the two reads below come well inside it, even on a loaded machine
        instances, ops = slow.client("InstancesClient"), slow.client("ZoneOperationsClient")
        started = time.monotonic()
        op = instances.insert_unary(project=slow.project, zone=ZONE, instance_resource=vm("a"), timeout=5)
        assert op.status == compute_v1.Operation.Status.PENDING
        assert live(slow, "a")["status"] == "PROVISIONING"
        waited = ops.wait(project=slow.project, zone=ZONE, operation=op.name, timeout=10)
        assert waited.status == DONE and 1.0 <= time.monotonic() - started < 8.0  # done, not the wait's timeout (10 s)
        assert live(slow, "a")["status"] == "RUNNING"
        # The non-unary insert() polls with a ZoneOperationsClient it builds itself; cloud.client() points that one here.
        extended = instances.insert(project=slow.project, zone=ZONE, instance_resource=vm("b"), timeout=5)
        extended.result(timeout=10)
        assert extended.done() and live(slow, "b")["status"] == "RUNNING"
    bare = compute_v1.InstancesClient(client_options=ClientOptions(api_endpoint="http://127.0.0.1:9"),
                                      credentials=AnonymousCredentials(), transport="rest")  # type: ignore[no-untyped-call]  # fmt: skip
    assert bare._transport._zone_operations_client._transport._host == "https://compute.googleapis.com"  # not ours


def test_list_filters_by_label_and_status_and_pages(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    for i in range(5):
        create(clients, cloud, vm(f"r1-{i}", labels={"run": "r1", "role": "worker" if i else "head"}))
    create(clients, cloud, vm("other", labels={"run": "r2"}))
    cloud.set_status(ZONE, "r1-4", "TERMINATED")

    def names(filter_: str, **kw: Any) -> list[str]:
        request = {"project": cloud.project, "zone": ZONE, "filter": filter_, **kw}
        return [i.name for i in clients["Instances"].list(request=request, timeout=5)]

    assert names('labels.run = "r1"') == [f"r1-{i}" for i in range(5)]
    assert names("labels.run=r1 AND status != TERMINATED") == [f"r1-{i}" for i in range(4)]
    assert names('labels.run = "r1" labels.role = "head"') == ["r1-0"]
    assert names("status = RUNNING AND labels.run = r2") == ["other"]
    assert names('labels.run = "nope"') == []
    calls_before = len(cloud.calls("instances.list"))
    assert names('labels.run = "r1"', max_results=2) == [f"r1-{i}" for i in range(5)]  # the pager follows nextPageToken
    pages = cloud.calls("instances.list")[calls_before:]
    assert [c.query.get("pageToken") is not None for c in pages] == [False, True, True]
    assert all(c.query["maxResults"] == "2" for c in pages)
    with pytest.raises(gexc.BadRequest):
        names('labels.run = "r1" OR labels.run = "r2"')  # refused, never silently misread


def test_aggregated_list_spans_zones_and_marks_empty_ones(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    create(clients, cloud, vm("a", labels={"run": "r1"}))
    create(clients, cloud, vm("b", "europe-west4-b", labels={"run": "r1"}), "europe-west4-b")
    create(clients, cloud, vm("c", "europe-west4-b", labels={"run": "r2"}), "europe-west4-b")
    request = {"project": cloud.project, "filter": 'labels.run = "r1"'}
    scopes = dict(clients["Instances"].aggregated_list(request=request, timeout=5))
    assert set(scopes) == {f"zones/{z}" for zs in cloud.zones.values() for z in zs}
    assert [i.name for i in scopes[f"zones/{ZONE}"].instances] == ["a"]
    assert [i.name for i in scopes["zones/europe-west4-b"].instances] == ["b"]
    assert scopes["zones/us-east1-b"].warning.code == "NO_RESULTS_ON_PAGE" and not scopes["zones/us-east1-b"].instances


def test_delete_removes_the_instance(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    create(clients, cloud, vm("a"))
    op = clients["Instances"].delete_unary(project=cloud.project, zone=ZONE, instance="a", timeout=5)
    assert op.operation_type == "delete" and op.status == DONE
    assert cloud.instance(ZONE, "a") is None
    with pytest.raises(gexc.NotFound, match=f"projects/{cloud.project}/zones/{ZONE}/instances/a' was not found"):
        clients["Instances"].get(project=cloud.project, zone=ZONE, instance="a", timeout=5)
    with pytest.raises(gexc.NotFound):
        clients["Instances"].delete_unary(project=cloud.project, zone=ZONE, instance="a", timeout=5)


def test_a_duplicate_name_in_the_zone_is_a_conflict(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    create(clients, cloud, vm("a"))
    with pytest.raises(gexc.Conflict) as caught:
        create(clients, cloud, vm("a"))
    assert caught.value.errors[0]["reason"] == "alreadyExists"
    create(clients, cloud, vm("a", "us-central1-b"), "us-central1-b")  # the same name in another zone is fine
    assert len(cloud.instances()) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda i: setattr(i, "machine_type", ""), "Required field 'resource.machineType' not specified"),
        (lambda i: i.disks.pop(), "Required field 'resource.disks' not specified"),
        (lambda i: setattr(i, "name", "Bad_Name"), "Invalid value for field 'resource.name'"),
        (lambda i: i.labels.update({"Run": "x"}), "Invalid value for field 'resource.labels'"),
        (lambda i: setattr(i, "machine_type", "zones/us-east1-b/machineTypes/n2-standard-4"), "resource.machineType"),
        (lambda i: setattr(i, "machine_type", f"zones/{ZONE}/machineTypes/g2-standard-4"), "do not support live migration"),
    ],
)
def test_an_invalid_instance_is_a_bad_request(cloud: GcpCloud, clients: dict[str, Any], change: Any, message: str) -> None:
    inst = vm("a")
    change(inst)
    with pytest.raises(gexc.BadRequest, match=message):
        create(clients, cloud, inst)
    assert cloud.instances() == [] and cloud.calls("instances.insert")[-1].status == 400


def test_simulated_maintenance_on_a_spot_vm_is_a_preemption() -> None:
    with GcpCloud(preempt_notice_s=2.0) as short:  # long enough for a loaded machine's REST calls, not a fixed wait
        instances, ops = short.client("InstancesClient"), short.client("ZoneOperationsClient")
        for name, action in (("deleted", "DELETE"), ("stopped", "STOP")):
            op = instances.insert_unary(project=short.project, zone=ZONE, instance_resource=vm(name, spot=True, action=action))
            assert op.status == DONE
            instances.simulate_maintenance_event_unary(project=short.project, zone=ZONE, instance=name, timeout=5)
            assert short.preempted(ZONE, name) and live(short, name)["status"] == "RUNNING"
        assert live(short, "deleted")["scheduling"]["preemptible"] is True
        wait_until(lambda: short.instance(ZONE, "deleted") is None and live(short, "stopped")["status"] == "TERMINATED",
                   timeout_s=10, every_s=0.05, what="the preempted VMs deleted and stopped")  # fmt: skip
        assert not short.preempted(ZONE, "deleted") and short.preempted(ZONE, "stopped")
        request = {"project": short.project, "zone": ZONE, "filter": 'operationType = "compute.instances.preempted"'}
        assert sorted(o.target_link.rsplit("/", 1)[1] for o in ops.list(request=request, timeout=5)) == ["deleted", "stopped"]


def test_simulated_maintenance_on_a_standard_vm_is_a_maintenance_event() -> None:
    with GcpCloud(preempt_notice_s=2.0) as short:
        instances = short.client("InstancesClient")
        instances.insert_unary(project=short.project, zone=ZONE, instance_resource=vm("gpu", machine="g2-standard-4"))
        instances.insert_unary(project=short.project, zone=ZONE, instance_resource=vm("cpu"))
        for name in ("gpu", "cpu"):
            instances.simulate_maintenance_event_unary(project=short.project, zone=ZONE, instance=name, timeout=5)
        assert short.maintenance_event(ZONE, "gpu") == "TERMINATE_ON_HOST_MAINTENANCE"
        assert short.maintenance_event(ZONE, "cpu") == "MIGRATE_ON_HOST_MAINTENANCE" and not short.preempted(ZONE, "cpu")
        wait_until(lambda: short.maintenance_event(ZONE, "gpu") == "NONE", timeout_s=10, every_s=0.05, what="the event over")
        assert live(short, "gpu")["status"] == "RUNNING"


def test_set_labels_and_metadata_check_the_fingerprint(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    create(clients, cloud, vm("a"))
    got = clients["Instances"].get(project=cloud.project, zone=ZONE, instance="a", timeout=5)
    assert got.label_fingerprint == "42WmSpB8rSM="  # Google's fingerprint of no labels
    body = compute_v1.InstancesSetLabelsRequest(labels={"run": "r9"}, label_fingerprint=got.label_fingerprint)
    clients["Instances"].set_labels_unary(
        project=cloud.project, zone=ZONE, instance="a", instances_set_labels_request_resource=body
    )
    assert live(cloud, "a")["labels"] == {"run": "r9"}
    with pytest.raises(gexc.PreconditionFailed):  # the same, now stale, fingerprint
        clients["Instances"].set_labels_unary(project=cloud.project, zone=ZONE, instance="a",
                                              instances_set_labels_request_resource=body)  # fmt: skip
    metadata = compute_v1.Metadata(fingerprint=got.metadata.fingerprint, items=[compute_v1.Items(key="k", value="v")])
    clients["Instances"].set_metadata_unary(project=cloud.project, zone=ZONE, instance="a", metadata_resource=metadata)
    assert live(cloud, "a")["metadata"]["items"] == [{"key": "k", "value": "v"}]
    with pytest.raises(gexc.PreconditionFailed):
        clients["Instances"].set_metadata_unary(project=cloud.project, zone=ZONE, instance="a", metadata_resource=metadata)


def test_firewalls_insert_patch_list_delete_with_googles_checks(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    firewalls, global_ops = clients["Firewalls"], clients["GlobalOperations"]
    rule = compute_v1.Firewall(name="ddctl-ssh", network="global/networks/default", direction="INGRESS", target_tags=["ddctl"],
                               allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])])  # fmt: skip
    with pytest.raises(gexc.BadRequest, match="INGRESS rule needs sourceRanges"):
        firewalls.insert_unary(project=cloud.project, firewall_resource=rule, timeout=5)
    rule.source_ranges = ["100.100.0.1/32"]
    op = firewalls.insert_unary(project=cloud.project, firewall_resource=rule, timeout=5)
    assert op.self_link.endswith(f"/global/operations/{op.name}") and not op.zone
    assert global_ops.wait(project=cloud.project, operation=op.name, timeout=5).status == DONE
    with pytest.raises(gexc.Conflict):
        firewalls.insert_unary(project=cloud.project, firewall_resource=rule, timeout=5)
    got = firewalls.get(project=cloud.project, firewall="ddctl-ssh", timeout=5)
    assert got.priority == 1000 and got.allowed[0].ports == ["22"] and got.network.endswith("/global/networks/default")
    patch = compute_v1.Firewall(
        source_ranges=["100.100.0.0/24"], allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22", "8000-8100"])]
    )
    firewalls.patch_unary(project=cloud.project, firewall="ddctl-ssh", firewall_resource=patch, timeout=5)
    assert cloud.firewalls()[0]["sourceRanges"] == ["100.100.0.0/24"] and cloud.firewalls()[0]["targetTags"] == ["ddctl"]
    listed = firewalls.list(request={"project": cloud.project, "filter": 'name = "ddctl-*"'}, timeout=5)
    assert [f.name for f in listed] == ["ddctl-ssh"]
    firewalls.delete_unary(project=cloud.project, firewall="ddctl-ssh", timeout=5)
    assert cloud.firewalls() == []
    with pytest.raises(gexc.NotFound):
        firewalls.get(project=cloud.project, firewall="ddctl-ssh", timeout=5)


def test_raw_json_is_googles_int64s_are_strings_ports_must_be(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    op = create(clients, cloud, vm("a"))
    sent = cloud.calls("instances.insert")[0].body
    assert sent is not None and sent["disks"][0]["initializeParams"]["diskSizeGb"] == "50"  # what the client sent
    base = f"{cloud.endpoint}/compute/v1/projects/{cloud.project}"
    raw = httpx.get(f"{base}/zones/{ZONE}/instances/a").json()
    assert isinstance(raw["id"], str) and raw["id"].isdigit() and raw["id"] == str(op.target_id)
    assert raw["disks"][0]["diskSizeGb"] == "50" and raw["kind"] == "compute#instance"
    raw_op = httpx.get(f"{base}/zones/{ZONE}/operations/{op.name}").json()
    assert isinstance(raw_op["targetId"], str) and raw_op["status"] == "DONE" and raw_op["kind"] == "compute#operation"
    bad = {"name": "raw", "sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "tcp", "ports": [22]}]}
    answer = httpx.post(f"{base}/global/firewalls", json=bad)
    assert answer.status_code == 400 and answer.json()["error"]["errors"][0]["reason"] == "invalid"
    unknown = httpx.get(f"{base}/zones/{ZONE}/gizmos")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == 404


def test_unknown_zones_projects_and_networks_are_not_found(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    with pytest.raises(gexc.NotFound, match=f"The resource 'projects/{cloud.project}/zones/mars-1a' was not found"):
        clients["Instances"].get(project=cloud.project, zone="mars-1a", instance="a", timeout=5)
    with pytest.raises(gexc.NotFound, match="The resource 'projects/elsewhere' was not found"):
        list(clients["Instances"].list(project="elsewhere", zone=ZONE, timeout=5))
    with pytest.raises(gexc.NotFound):
        clients["Zones"].get(project=cloud.project, zone="mars-1a", timeout=5)
    assert clients["Networks"].get(project=cloud.project, network="default", timeout=5).auto_create_subnetworks
    with pytest.raises(gexc.NotFound):
        clients["Networks"].get(project=cloud.project, network="vpc-x", timeout=5)


def test_zones_list_and_get(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    zones = list(clients["Zones"].list(project=cloud.project, timeout=5))
    assert sorted(z.name for z in zones) == sorted(z for zs in cloud.zones.values() for z in zs)
    assert all(z.status == "UP" for z in zones)
    region = "https://www.googleapis.com/compute/v1/projects/ddctl-test/regions/us-east1"
    in_region = clients["Zones"].list(request={"project": cloud.project, "filter": f'region = "{region}"'}, timeout=5)
    assert [z.name for z in in_region] == ["us-east1-b", "us-east1-c"]
    assert clients["Zones"].get(project=cloud.project, zone="asia-east1-b", timeout=5).region.endswith("/regions/asia-east1")


def test_the_hypervisor_api_and_reset_never_reuse_an_address(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    create(clients, cloud, vm("a"))
    first = live(cloud, "a")["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    cloud.set_status(ZONE, "a", "TERMINATED")
    assert clients["Instances"].get(project=cloud.project, zone=ZONE, instance="a", timeout=5).status == "TERMINATED"
    with pytest.raises(ValueError):
        cloud.set_status(ZONE, "a", "ASLEEP")
    cloud.remove(ZONE, "a")
    assert cloud.instances() == [] and cloud.address_of(first) is None
    cloud.reset()
    assert cloud.calls() == []
    create(clients, cloud, vm("a"))
    assert live(cloud, "a")["networkInterfaces"][0]["accessConfigs"][0]["natIP"] != first


def test_waits_and_requests_run_side_by_side() -> None:
    with GcpCloud(op_delay_s=3.0) as slow:  # the get below comes well inside it, even on a loaded machine
        slow.WAIT_S = 10.0  # and the wait blocks until the operation is done
        instances, ops = slow.client("InstancesClient"), slow.client("ZoneOperationsClient")
        op = instances.insert_unary(project=slow.project, zone=ZONE, instance_resource=vm("a"), timeout=5)
        done: list[compute_v1.Operation] = []
        waiter = threading.Thread(target=lambda: done.append(ops.wait(project=slow.project, zone=ZONE, operation=op.name)))
        waiter.start()
        got = instances.get(project=slow.project, zone=ZONE, instance="a", timeout=5)  # answered while the wait blocks
        assert got.status == "PROVISIONING" and not done
        waiter.join(timeout=30)
        assert done and done[0].status == DONE


def test_a_reserved_address_is_drawn_from_the_nat_pool_and_an_instance_can_take_it(
    cloud: GcpCloud, clients: dict[str, Any]
) -> None:
    addresses, waiter = cloud.client("AddressesClient"), cloud.client("RegionOperationsClient")
    op = addresses.insert_unary(project=cloud.project, region="us-central1",
                                address_resource=compute_v1.Address(name="syncer-ip"), timeout=10)  # fmt: skip
    done = waiter.wait(project=cloud.project, region="us-central1", operation=op.name, timeout=10)
    assert done.status == compute_v1.Operation.Status.DONE and done.region.endswith("/regions/us-central1")
    reserved = addresses.get(project=cloud.project, region="us-central1", address="syncer-ip", timeout=10)
    assert ipaddress.IPv4Address(reserved.address) in NAT_POOL and reserved.status == "RESERVED"
    inst = vm("at-reserved")
    inst.network_interfaces[0].access_configs[0].nat_i_p = reserved.address
    create(clients, cloud, inst)
    assert live(cloud, "at-reserved")["networkInterfaces"][0]["accessConfigs"][0]["natIP"] == reserved.address
    with pytest.raises(gexc.Conflict):
        addresses.insert_unary(project=cloud.project, region="us-central1", address_resource=compute_v1.Address(name="syncer-ip"))
    with pytest.raises(gexc.NotFound):
        addresses.get(project=cloud.project, region="mars-north1", address="syncer-ip", timeout=10)
    op = addresses.delete_unary(project=cloud.project, region="us-central1", address="syncer-ip", timeout=10)
    waiter.wait(project=cloud.project, region="us-central1", operation=op.name, timeout=10)
    assert cloud.addresses() == []


def test_serial_port_one_keeps_what_the_vm_printed_while_the_instance_exists(cloud: GcpCloud, clients: dict[str, Any]) -> None:
    create(clients, cloud, vm("talker"))
    cloud.set_console(ZONE, "talker", "boot ok\nddctl-file /opt/ddctl/summary.json e30=\n")
    out = clients["Instances"].get_serial_port_output(project=cloud.project, zone=ZONE, instance="talker", timeout=10)
    assert out.contents.endswith("summary.json e30=\n") and out.next_ == len(out.contents)
    cloud.remove(ZONE, "talker")
    with pytest.raises(gexc.NotFound):  # a deleted VM's console is gone with it
        clients["Instances"].get_serial_port_output(project=cloud.project, zone=ZONE, instance="talker", timeout=10)
