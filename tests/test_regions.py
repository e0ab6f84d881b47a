"""regions.yaml: the example loads; every mistake names the file, the key path and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ddctl.config.regions import job_config, load_regions
from ddctl.errors import RegionsError

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "run": "t",
    "syncer": "a",
    "training": {"preset": "tiny", "quorum": 1, "codec": "int4"},
    "regions": [
        {"name": "a", "provider": "process", "learners": 2, "link": {"up_mbps": 100, "down_mbps": 100}},
        {"name": "b", "provider": "docker", "preemption": {"mean_between_s": 600, "notice_s": 30}},
    ],
}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_repository_example_is_valid_and_has_three_bandwidths() -> None:
    rf = load_regions(ROOT / "regions.yaml")
    assert len(rf.regions) == 3 and rf.syncer in {r.name for r in rf.regions}
    assert len({r.link.up_mbps for r in rf.regions if r.link}) == 3
    assert job_config(rf).budget.learners == rf.learners


def test_a_good_file_loads_typed(tmp_path: Path) -> None:
    rf = load_regions(write(tmp_path, GOOD))
    a, b = rf.regions
    assert (a.learners, a.link and a.link.up_mbps, b.learners, b.preemption and b.preemption.notice_s) == (2, 100.0, 1, 30.0)
    assert rf.learners == 3 and rf.region("b").provider == "docker"


def variant(**changes: object) -> dict:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        (variant(regions__0__provider="azure"), ["regions[0].provider", "unknown provider 'azure'", "aws | gcp | docker"]),
        (variant(syncer="nowhere"), ["syncer:", "'nowhere' is not a region", "allowed: a, b"]),
        ({k: v for k, v in GOOD.items() if k != "syncer"}, ["syncer: required"]),
        (variant(regions__0__link={"up_mbps": -5, "down_mbps": 10}), ["regions[0].link.up_mbps", "must be > 0"]),
        (
            variant(regions__0__link={"up_mbps": float("inf"), "down_mbps": 10}),  # it was blamed on synchronizer:
            ["regions[0].link.up_mbps", "finite number", "allowed: a number > 0"],
        ),  # fmt: skip
        (variant(regions__1__lnik={"up_mbps": 5, "down_mbps": 5}), ["regions[1].lnik", "did you mean 'link'"]),
        (variant(training__quorom=2), ["training.quorom", "did you mean 'quorum'"]),
        (variant(regions__0__learners=0), ["regions[0].learners", "must be >= 1"]),
        (variant(regions__0__spot="yes"), ["regions[0].spot", "must be bool"]),
        (variant(regions__1__name="a"), ["name 'a' is used twice"]),
        (variant(regions__0__provider="aws"), ["regions[0].cloud_region: required for provider 'aws'"]),
        (variant(training__codec="int3"), ["training.codec", "int4"]),
        ([1, 2], ["the file: must be a mapping"]),
        (variant(regions__0__gpus=0), ["regions[0].gpus", "must be >= 1", "an integer 1..64"]),
    ],
)
def test_mistakes_name_the_file_the_key_and_what_is_allowed(tmp_path: Path, data: object, needles: list[str]) -> None:
    path = write(tmp_path, data)
    with pytest.raises(RegionsError) as info:
        load_regions(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    for needle in needles:
        assert needle in message, message


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(RegionsError, match="cannot read"):
        load_regions(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("regions: [\n")
    with pytest.raises(RegionsError, match="not valid YAML"):
        load_regions(bad)


def test_binary_text_and_alias_bombs_are_refused_and_plain_aliases_still_load(tmp_path: Path) -> None:
    """Found by a hostile-input audit: bytes that are not UTF-8 raised UnicodeDecodeError (a traceback), and nine
    levels of nine aliases (an alias bomb) loaded at once and then hung validation, which expands them."""
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"run: t\xff\xfe\n")
    with pytest.raises(RegionsError, match=r"binary.yaml: not UTF-8 text \(byte 6\); a regions file is YAML in UTF-8"):
        load_regions(binary)
    bomb, previous = "a: &a [" + ", ".join(["x"] * 9) + "]\n", "a"
    for name in "bcdefghi":
        bomb += f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]\n"
        previous = name
    (tmp_path / "bomb.yaml").write_text(bomb)
    with pytest.raises(RegionsError, match=r"bomb.yaml: expands to more than 100,000 values \(YAML aliases"):
        load_regions(tmp_path / "bomb.yaml")
    shared = """run: t
syncer: a
regions:
  - {name: a, provider: process, learners: 2, link: &fast {up_mbps: 100, down_mbps: 100}}
  - {name: b, provider: process, link: *fast}
"""
    (tmp_path / "shared.yaml").write_text(shared)
    a, b = load_regions(tmp_path / "shared.yaml").regions  # an alias used as YAML users use them still loads
    assert a.link == b.link and b.link is not None and b.link.up_mbps == 100
    (tmp_path / "twice.yaml").write_text("run: t1\nrun: t2\n" + shared.partition("\n")[2])  # the last one won, silently
    with pytest.raises(RegionsError, match="twice.yaml: not valid YAML \\('run' is written twice in one mapping"):
        load_regions(tmp_path / "twice.yaml")
    merged = shared.replace("  - {name: b, provider: process, link: *fast}", "  - {<<: *base, name: b}").replace(
        "  - {name: a,", "  - &base {name: a,"
    )
    (tmp_path / "merged.yaml").write_text(merged)  # a merge key's keys may be overridden: that is not a key twice
    assert [r.name for r in load_regions(tmp_path / "merged.yaml").regions] == ["a", "b"]


def test_training_values_the_job_refuses_are_reported_against_the_file_and_the_key(tmp_path: Path) -> None:
    with pytest.raises(RegionsError, match="training.preset: preset must be one of") as info:
        load_regions(write(tmp_path, variant(training__preset="gigantic")))  # at load time, before anything starts
    assert info.value.key == "training.preset"
    with pytest.raises(RegionsError, match=r"training.fragments: fragments must be >= 1"):
        load_regions(write(tmp_path, variant(training__fragments=0)))
    learners = load_regions(write(tmp_path, GOOD)).learners
    with pytest.raises(RegionsError, match=rf"training.quorum: quorum \(9\) must be at most the learners \({learners}\)") as info:
        load_regions(write(tmp_path, variant(training__quorum=9)))  # it ran as K = M, silently
    assert info.value.key == "training.quorum"
    many = {"run": "t", "syncer": "a", "regions": [{"name": "a", "provider": "process", "learners": 100000}]}
    with pytest.raises(RegionsError, match=r"regions: their learners add up to 100000; learners must be in \[1, 64\]") as info:
        load_regions(write(tmp_path, many))  # it was reported as training.learners, a key the file does not have
    assert info.value.key == "regions"


GCP = {"name": "g", "provider": "gcp", "cloud_region": "us-central1"}
AWS = {"provider": "aws", "cloud_region": "us-east-1"}


def with_region(**fields: object) -> dict:
    """GOOD plus a third region of ``fields`` (a GCP one unless they say otherwise)."""
    data = variant()
    data["regions"].append({**GCP, **fields})
    return data


def test_gpus_default_to_the_vms_gpus_else_one(tmp_path: Path) -> None:
    plain, attached, built_in, aws = (
        load_regions(write(tmp_path, with_region(**fields))).regions[2]
        for fields in (
            {"instance_type": "e2-standard-4"},
            {"instance_type": "n1-standard-8", "accelerator": "nvidia-tesla-t4", "accelerator_count": 4},
            {"instance_type": "a2-highgpu-8g"},  # its 8 A100 come with the type (the provider's table)
            {**AWS, "instance_type": "m7i.large"},  # an AWS type without GPUs in the table: 1
        )
    )
    assert (plain.gpus, plain.ranks, aws.ranks) == (None, 1, 1)
    assert (attached.gpus, attached.ranks) == (None, 4)
    assert (built_in.gpus, built_in.ranks) == (None, 8)
    local = load_regions(write(tmp_path, variant(regions__1__accelerator="nvidia-l4", regions__1__accelerator_count=2)))
    assert [r.ranks for r in local.regions] == [1, 2]  # a region without accelerator: 1


def test_aws_gpu_types_imply_their_gpus_and_a_list_of_types_its_fewest(tmp_path: Path) -> None:
    four, either, eight = (
        load_regions(write(tmp_path, with_region(**AWS, **fields))).regions[2]
        for fields in (
            {"instance_type": "g5.12xlarge"},  # 4 A10G
            {"instance_types": ["g5.12xlarge", "g5.xlarge"]},  # up may launch either: the smaller bounds a learner
            {"instance_type": "p5.48xlarge", "gpus": 8},  # as many ranks as the type's 8 H100
        )
    )
    assert (four.gpus, four.ranks) == (None, 4)
    assert (either.gpus, either.ranks) == (None, 1)
    assert (eight.gpus, eight.ranks) == (8, 8)


def test_explicit_gpus_win_over_the_default(tmp_path: Path) -> None:
    rf = load_regions(write(tmp_path, variant(regions__0__gpus=4)))
    assert [r.ranks for r in rf.regions] == [4, 1]  # no accelerator bounds CPU ranks
    fewer = load_regions(write(tmp_path, with_region(instance_type="a2-highgpu-8g", gpus=2))).regions[2]
    assert (fewer.gpus, fewer.ranks) == (2, 2)


@pytest.mark.parametrize(
    ("fields", "needles"),
    [
        (
            {"instance_type": "n1-standard-8", "accelerator": "nvidia-l4", "accelerator_count": 4, "gpus": 8},
            ["regions[2].gpus: 8 ranks but the VM has 4 nvidia-l4 accelerators", "allowed: 1..4"],
        ),
        (
            {"instance_types": ["a2-highgpu-8g", "a2-highgpu-2g"], "gpus": 4},  # up may launch the smaller one
            ["regions[2].gpus: 4 ranks but a2-highgpu-2g comes with 2 nvidia-tesla-a100 GPUs", "allowed: 1..2"],
        ),
        (
            {**AWS, "instance_type": "p5.48xlarge", "gpus": 16},
            ["regions[2].gpus: 16 ranks but p5.48xlarge comes with 8 nvidia-h100 GPUs", "allowed: 1..8"],
        ),
    ],
)
def test_more_gpus_than_the_vm_has_are_refused(tmp_path: Path, fields: dict, needles: list[str]) -> None:
    path = write(tmp_path, with_region(**fields))
    with pytest.raises(RegionsError) as info:
        load_regions(path)
    assert str(info.value).startswith(f"{path}: ") and info.value.key == "regions[2].gpus"
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_a_batch_the_ranks_cannot_split_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, variant(regions__1__gpus=3, training__batch_size=8))
    with pytest.raises(RegionsError) as info:
        load_regions(path)
    message = str(info.value)
    assert message.startswith(f"{path}: regions[1].gpus: ") and info.value.key == "regions[1].gpus"
    for needle in ("region 'b'", "3 ranks", "training.batch_size 8", "a gpus that divides 8"):
        assert needle in message, message
    defaulted = write(tmp_path, with_region(instance_type="n1-standard-8", accelerator="nvidia-l4", accelerator_count=3))
    with pytest.raises(RegionsError, match=r"region 'g' runs 3 ranks per learner \(its VM's GPUs\)"):
        load_regions(defaulted)
    assert load_regions(write(tmp_path, variant(regions__1__gpus=4, training__batch_size=12))).regions[1].ranks == 4


def test_a_learner_over_several_vms_splits_the_batch_over_all_their_ranks(tmp_path: Path) -> None:
    """gpus x nodes ranks share one learner's batch; nodes is bounded like gpus."""
    path = write(tmp_path, variant(regions__1__gpus=2, regions__1__nodes=3, training__batch_size=8))
    with pytest.raises(RegionsError) as info:
        load_regions(path)
    for needle in ("regions[1].gpus", "2 ranks per learner on each of 3 nodes", "gpus x nodes that divides 8"):
        assert needle in str(info.value), str(info.value)
    loaded = load_regions(write(tmp_path, variant(regions__1__gpus=2, regions__1__nodes=3, training__batch_size=12)))
    assert (loaded.regions[1].nodes, loaded.regions[1].world) == (3, 6)
    for bad in (0, 65, "two"):
        with pytest.raises(RegionsError, match=r"regions\[1\]\.nodes: .*1\.\.64"):
            load_regions(write(tmp_path, variant(regions__1__nodes=bad)))
