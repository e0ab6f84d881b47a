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
        (variant(regions__1__lnik={"up_mbps": 5, "down_mbps": 5}), ["regions[1].lnik", "did you mean 'link'"]),
        (variant(training__quorom=2), ["training.quorom", "did you mean 'quorum'"]),
        (variant(regions__0__learners=0), ["regions[0].learners", "must be >= 1"]),
        (variant(regions__0__spot="yes"), ["regions[0].spot", "must be bool"]),
        (variant(regions__1__name="a"), ["name 'a' is used twice"]),
        (variant(regions__0__provider="aws"), ["regions[0].cloud_region: required for provider 'aws'"]),
        (variant(training__codec="int3"), ["training.codec", "int4"]),
        ([1, 2], ["the file: must be a mapping"]),
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


def test_training_values_the_job_refuses_are_reported_against_the_file_and_the_key(tmp_path: Path) -> None:
    with pytest.raises(RegionsError, match="training.preset: preset must be one of") as info:
        load_regions(write(tmp_path, variant(training__preset="gigantic")))  # at load time, before anything starts
    assert info.value.key == "training.preset"
    with pytest.raises(RegionsError, match=r"training.fragments: fragments must be >= 1"):
        load_regions(write(tmp_path, variant(training__fragments=0)))
