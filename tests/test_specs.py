"""What a learner is told to run: one learner over a region's ranks is ``--gpus N`` on its command line."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from cryptography import x509

from ddctl.config.regions import Checkpoints, Region
from ddctl.control.credentials import make_tls
from ddctl.control.rundir import RunDir
from ddctl.control.specs import RELAY_PORT, learner_spec, syncer_spec
from ddctl.errors import DdctlError
from ddctl.providers.base import RegionInfo
from ddctl_agents.agent.relay_host import HOST_FILES
from ddctl_agents.relay import server_name
from ddctl_agents.service.auth import read_secret, relay_key, verify_token

INFO = RegionInfo(region="east", provider="process", python="/usr/bin/python3", remote=False, syncer_host="127.0.0.1")


@pytest.fixture(autouse=True)
def job_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run directory with the job's secret, which ``learner_spec`` derives the learner's token from."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    RunDir("r").job.mkdir(parents=True)
    (RunDir("r").job / "secret").write_text(secrets.token_hex(32) + "\n")


@pytest.mark.parametrize(("fields", "flag"), [({"gpus": 2}, ["--gpus", "2"]), ({"gpus": 1}, []), ({}, [])])
def test_a_learner_over_several_ranks_is_told_how_many(fields: dict, flag: list[str]) -> None:
    region = Region(name="east", provider="process", **fields)
    argv = list(learner_spec("r", INFO, region, "L0", (9000,)).argv)
    found = argv[argv.index("--gpus") : argv.index("--gpus") + 2] if "--gpus" in argv else []
    assert found == flag and argv.count("--gpus") == len(flag) // 2


def test_the_default_ranks_are_the_vms_accelerators() -> None:
    region = Region(name="east", provider="process", accelerator="nvidia-l4", accelerator_count=4)
    argv = learner_spec("r", INFO, region, "L0", (9000,)).argv
    assert argv[-2:] == ("--gpus", "4")


def test_every_vm_of_a_learner_runs_its_ranks_and_meets_at_node_0() -> None:
    """Same learner (token, data shard), own instance name, log and summary; the rendezvous follows node 0."""
    from ddctl.control.credentials import token_for
    from ddctl.control.specs import with_rendezvous

    region = Region(name="east", provider="process", gpus=2, nodes=3)
    first, third = (learner_spec("r", INFO, region, "L4", (9000,), node=k, meet=29555) for k in (0, 2))
    assert (first.name, third.name) == ("L4", "L4-n2") and first.log != third.log and first.summary != third.summary
    for spec in (first, third):
        argv = list(spec.argv)
        assert argv[argv.index("--name") + 1] == "L4"  # the learner's identity, on every VM
        assert argv[argv.index("--nodes") + 1] == "3" and argv[argv.index("--gpus") + 1] == "2"
        assert argv[argv.index("--rendezvous") + 1] == "127.0.0.1:29555"
        assert Path(argv[argv.index("--token-file") + 1]).read_text() == token_for(RunDir("r").job, "L4")
    moved = with_rendezvous(third, "10.0.3.7")
    assert moved.argv[moved.argv.index("--rendezvous") + 1] == "10.0.3.7:29555"
    assert [a for a in moved.argv if a != "10.0.3.7:29555"] == [a for a in third.argv if a != "127.0.0.1:29555"]
    alone = learner_spec("r", INFO, Region(name="east", provider="process"), "L0", (9000,))
    assert "--nodes" not in alone.argv and with_rendezvous(alone, "10.0.0.1") == alone


def test_a_vm_of_its_own_hosts_the_rendezvous_on_torchruns_port_and_this_machine_on_a_free_one() -> None:
    from dataclasses import replace

    from ddctl.control.specs import RENDEZVOUS_PORT, rendezvous_port

    assert rendezvous_port(replace(INFO, remote=True)) == RENDEZVOUS_PORT == 29400
    free = rendezvous_port(INFO)
    assert 1024 <= free < 65536 and free != RENDEZVOUS_PORT


def test_a_node_is_not_pointed_at_a_node_0_without_an_address() -> None:
    from ddctl.control.specs import with_rendezvous

    spec = learner_spec("r", INFO, Region(name="east", provider="process", nodes=2), "L0", (9000,), node=1, meet=29500)
    with pytest.raises(DdctlError, match="L0-n1: its learner's node 0 came up without a private address"):
        with_rendezvous(spec, "")


@pytest.mark.parametrize(("cadence", "flag"), [(1, []), (2, ["--cadence", "2"]), (8, ["--cadence", "8"])])
def test_a_learner_is_told_its_regions_planned_cadence(cadence: int, flag: list[str]) -> None:
    argv = list(learner_spec("r", INFO, Region(name="east", provider="process"), "L0", (9000,), cadence=cadence).argv)
    found = argv[argv.index("--cadence") : argv.index("--cadence") + 2] if "--cadence" in argv else []
    assert found == flag and argv.count("--cadence") == len(flag) // 2


CLOUD_EAST = Region(name="east", provider="aws", cloud_region="us-east-1", instance_type="g5.xlarge")


def test_a_cloud_learner_is_pointed_at_each_shards_own_address() -> None:
    """Shards on cloud VMs (``tests/test_cloud_shards.py``): each at the address its region's provider reserved."""
    hosts = ("100.100.0.10", "100.100.64.3")
    cloud = RegionInfo(region="east", provider="aws", python="python3", remote=True, syncer_host=hosts[0], shard_hosts=hosts,
                       syncer_port=8443)  # fmt: skip
    spec = learner_spec("r", cloud, CLOUD_EAST, "L0", (8443, 8443))
    at = [spec.argv[i + 1] for i, arg in enumerate(spec.argv) if arg == "--syncer"]
    assert at == [f"https://{hosts[0]}:{8443}", f"https://{hosts[1]}:{8443}"]
    made = syncer_spec("r", cloud, 8443, CLOUD_EAST, shard=("syncer-s1", "S1"))
    assert "--shard" in made.argv and made.disks  # its state on a disk of its own


def test_a_replaced_syncer_looks_for_the_runs_newest_checkpoint_where_the_run_keeps_them() -> None:
    """``service/resume.starting_point``: one syncer writes its own checkpoints there and starts from them; a shard writes
    none (the controller's global ones go there), so it is told where to look, and only that."""
    cloud = RegionInfo(region="east", provider="aws", python="python3", remote=True, syncer_host="100.100.0.10",
                       shard_hosts=("100.100.0.10",), syncer_port=8443)  # fmt: skip
    kept = Checkpoints(url="s3://bucket/ckpt")

    def flag(argv: tuple[str, ...], name: str) -> str | None:
        return argv[argv.index(name) + 1] if name in argv else None

    one = syncer_spec("r", cloud, 8443, CLOUD_EAST, checkpoints=kept).argv
    assert flag(one, "--checkpoint-url") == "s3://bucket/ckpt/r" and flag(one, "--resume-url") is None
    shard = syncer_spec("r", cloud, 8443, CLOUD_EAST, checkpoints=kept, shard=("syncer-s1", "S1")).argv
    assert flag(shard, "--resume-url") == "s3://bucket/ckpt/r" and flag(shard, "--checkpoint-url") is None
    bare = syncer_spec("r", cloud, 8443, CLOUD_EAST, shard=("syncer-s1", "S1")).argv
    assert flag(bare, "--resume-url") is None  # no url: a replaced shard starts from the initial model


def test_a_cloud_relay_host_gets_its_relays_files_and_listens_on_every_interface(tmp_path: Path) -> None:
    """``agent/relay_host.py``: the relay's token for the shards, the region's key and its own certificate travel to the
    host's VM (never the synchronizer's key); another learner is given only its relay token, and loopback until
    ``with_relay`` points it at the host."""
    make_tls(RunDir("r").job / "tls", "r", ["127.0.0.1"])
    cloud = RegionInfo(region="east", provider="aws", python="python3", remote=True, syncer_host="100.100.0.10")
    host = learner_spec("r", cloud, CLOUD_EAST, "L0", (8443,), relay=("host", RELAY_PORT))
    served = learner_spec("r", cloud, CLOUD_EAST, "L1", (8443,), relay=("served", RELAY_PORT))
    argv = list(host.argv)
    assert argv[argv.index("--host-relay") + 1] == f"0.0.0.0:{RELAY_PORT}"
    folder = argv[argv.index("--host-relay-dir") + 1]
    assert {f"{folder}/{name}" for name in HOST_FILES} <= set(host.files)
    shipped = {Path(local).read_text() for local in host.files.values()}
    assert (RunDir("r").job / "tls" / "server.key").read_text() not in shipped
    cert = x509.load_pem_x509_certificate(Path(host.files[f"{folder}/tls.pem"]).read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == [server_name("east")]
    token = Path(host.files[argv[argv.index("--relay-token-file") + 1]]).read_text().strip()
    assert verify_token(relay_key(read_secret((RunDir("r").job / "secret").read_text()), "east"), f"Bearer {token}") == "L0"
    assert (
        served.argv[served.argv.index("--relay") + 1] == f"https://127.0.0.1:{RELAY_PORT}" and "--host-relay" not in served.argv
    )
    assert not any(name.endswith(("tls.key", "/key")) for name in served.files)
    assert "--relay" not in learner_spec("r", cloud, CLOUD_EAST, "L2", (8443,)).argv  # a region without a relay
