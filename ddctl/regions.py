"""regions.yaml: which regions a job runs in, how they are linked, and the training knobs.

Validation walks the file with a schema and reports the first problem as
``FILE: KEY.PATH: what is wrong; allowed: ...`` (with a did-you-mean for typos),
so a bad file never reaches a provider. The loaded value is typed and frozen.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ddctl.errors import DdctlError

if TYPE_CHECKING:
    from ddctl_agents.train.job import JobConfig

PROVIDERS = ("aws", "gcp", "docker", "process")
LOCAL_PROVIDERS = ("docker", "process")
CODECS = ("fp32", "bf16", "int8", "int4", "int2", "int1")


class RegionsError(DdctlError):
    """regions.yaml is unreadable or invalid; the message names the file, the key and what is allowed."""


@dataclass(frozen=True, slots=True)
class LinkProfile:
    up_mbps: float
    down_mbps: float
    latency_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class PreemptionProfile:
    mean_between_s: float
    notice_s: float


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    provider: str
    learners: int = 1
    cloud_region: str = ""
    zones: tuple[str, ...] = ()
    instance_type: str = ""
    accelerator: str = ""
    spot: bool = True
    price_cap: float | None = None
    """USD per instance-hour we are willing to pay (spot bids above it are refused)."""
    link: LinkProfile | None = None
    preemption: PreemptionProfile | None = None


@dataclass(frozen=True, slots=True)
class Training:
    preset: str = "tiny"
    tokens: int = 1_000_000
    inner_steps: int = 24
    fragments: int = 24
    overlap: int = 2
    quorum: int = 1
    grace: bool = True
    codec: str = "int4"
    batch_size: int = 8
    max_bytes: int = 24 * 2**20
    seed: int = 0


@dataclass(frozen=True, slots=True)
class RegionsFile:
    path: Path
    run: str
    syncer: str
    training: Training
    regions: tuple[Region, ...]

    @property
    def learners(self) -> int:
        return sum(r.learners for r in self.regions)

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise RegionsError(f"{self.path}: no region named {name!r}; regions: {', '.join(r.name for r in self.regions)}")


# -- schema -------------------------------------------------------------------------------------
# key -> (type, required, check(value) -> error or None, what is allowed)
Check = Any
_POSITIVE = (lambda v: None if v > 0 else "must be > 0", "a number > 0")
_NON_NEGATIVE = (lambda v: None if v >= 0 else "must be >= 0", "a number >= 0")
_COUNT = (lambda v: None if v >= 1 else "must be >= 1", "an integer >= 1")
_NAME = (
    lambda v: None if v and v.replace("-", "").replace("_", "").isalnum() else "must be letters, digits, '-' or '_'",
    "a name",
)

_LINK = {
    "up_mbps": (float, True, *_POSITIVE),
    "down_mbps": (float, True, *_POSITIVE),
    "latency_ms": (float, False, *_NON_NEGATIVE),
}
_PREEMPTION = {
    "mean_between_s": (float, True, *_POSITIVE),
    "notice_s": (float, True, *_NON_NEGATIVE),
}
_REGION = {
    "name": (str, True, *_NAME),
    "provider": (str, True, lambda v: None if v in PROVIDERS else f"unknown provider {v!r}", " | ".join(PROVIDERS)),
    "learners": (int, False, *_COUNT),
    "cloud_region": (str, False, None, "a cloud region such as us-east-1"),
    "zones": (list, False, None, "an ordered list of zones to try"),
    "instance_type": (str, False, None, "an instance type such as g5.xlarge"),
    "accelerator": (str, False, None, "an accelerator such as nvidia-l4"),
    "spot": (bool, False, None, "true or false"),
    "price_cap": (float, False, *_POSITIVE),
    "link": (dict, False, None, "{up_mbps, down_mbps, latency_ms}"),
    "preemption": (dict, False, None, "{mean_between_s, notice_s}"),
}
_TRAINING = {
    "preset": (str, False, None, "a model preset"),
    "tokens": (int, False, *_COUNT),
    "inner_steps": (int, False, *_COUNT),
    "fragments": (int, False, *_COUNT),
    "overlap": (int, False, (lambda v: None if v >= 0 else "must be >= 0"), "an integer >= 0"),
    "quorum": (int, False, *_COUNT),
    "grace": (bool, False, None, "true or false"),
    "codec": (str, False, lambda v: None if v in CODECS else f"unknown codec {v!r}", " | ".join(CODECS)),
    "batch_size": (int, False, *_COUNT),
    "max_bytes": (int, False, (lambda v: None if v >= 4096 else "must be >= 4096"), "an integer >= 4096"),
    "seed": (int, False, *_NON_NEGATIVE),
}
_TOP = {
    "run": (str, False, *_NAME),
    "syncer": (str, True, None, "the name of one of the regions"),
    "training": (dict, False, None, "the training knobs"),
    "regions": (list, True, None, "a list of regions"),
}


def job_config(rf: RegionsFile) -> JobConfig:
    """The JobConfig every process of this job agrees on: the training knobs, one learner slot per instance."""
    from ddctl_agents.core.outer import OuterConfig
    from ddctl_agents.core.quorum import QuorumConfig
    from ddctl_agents.core.syncer import SyncerConfig
    from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget
    from ddctl_agents.train.job import JobConfig
    from ddctl_agents.train.learner import SyncSettings

    t = rf.training
    try:
        return JobConfig(
            inner=InnerConfig(preset=t.preset, batch_size=t.batch_size, seed=t.seed),
            data=DataConfig(max_bytes=t.max_bytes),
            budget=RunBudget(tokens=t.tokens, learners=rf.learners),
            sync=SyncSettings(fragments=t.fragments, inner_steps=t.inner_steps, codec=t.codec),
            syncer=SyncerConfig(
                quorum=QuorumConfig(quorum=t.quorum, grace=t.grace, overlap=t.overlap),
                outer=OuterConfig(),
                inner_steps=t.inner_steps,
            ),
        )
    except ValueError as exc:
        raise RegionsError(f"{rf.path}: training: {exc}") from None


def load_regions(path: Path) -> RegionsFile:
    """Read and validate ``path``; any problem is a RegionsError naming file, key and what is allowed."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RegionsError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise RegionsError(f"{path}: not valid YAML ({exc})") from None
    return parse_regions(raw, path)


def parse_regions(raw: Any, path: Path) -> RegionsFile:
    top = _section(raw, _TOP, path, "")
    training = Training(**_section(top.get("training", {}), _TRAINING, path, "training"))
    regions_raw = top["regions"]
    if not regions_raw:
        raise RegionsError(f"{path}: regions: must list at least one region")
    regions = tuple(_region(item, path, f"regions[{i}]") for i, item in enumerate(regions_raw))
    names = [r.name for r in regions]
    for name in names:
        if names.count(name) > 1:
            raise RegionsError(f"{path}: regions: name {name!r} is used twice; names must be unique")
    if top["syncer"] not in names:
        raise RegionsError(f"{path}: syncer: {top['syncer']!r} is not a region here; allowed: {', '.join(names)}")
    return RegionsFile(path=path, run=top.get("run", "ddctl"), syncer=top["syncer"], training=training, regions=regions)


def _region(raw: Any, path: Path, where: str) -> Region:
    values = _section(raw, _REGION, path, where)
    link = values.pop("link", None)
    preemption = values.pop("preemption", None)
    zones = values.pop("zones", [])
    if not all(isinstance(z, str) for z in zones):
        raise RegionsError(f"{path}: {where}.zones: must be a list of zone names")
    region = Region(
        **values,
        zones=tuple(zones),
        link=LinkProfile(**_section(link, _LINK, path, f"{where}.link")) if link is not None else None,
        preemption=PreemptionProfile(**_section(preemption, _PREEMPTION, path, f"{where}.preemption"))
        if preemption is not None
        else None,
    )
    if region.provider in ("aws", "gcp") and not region.cloud_region:
        raise RegionsError(f"{path}: {where}.cloud_region: required for provider {region.provider!r}")
    if region.link is not None and region.provider not in LOCAL_PROVIDERS:
        raise RegionsError(f"{path}: {where}.link: only local regions emulate links; allowed with: {', '.join(LOCAL_PROVIDERS)}")
    return region


def _section(raw: Any, schema: dict[str, tuple[Any, ...]], path: Path, where: str) -> dict[str, Any]:
    prefix = f"{where}." if where else ""
    if not isinstance(raw, dict):
        raise RegionsError(f"{path}: {where or 'the file'}: must be a mapping of keys {', '.join(schema)}")
    for key in raw:
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RegionsError(f"{path}: {prefix}{key}: unknown key{hint} allowed: {', '.join(schema)}")
    out: dict[str, Any] = {}
    for key, (kind, required, check, allowed) in schema.items():
        if key not in raw:
            if required:
                raise RegionsError(f"{path}: {prefix}{key}: required; allowed: {allowed}")
            continue
        value = raw[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise RegionsError(f"{path}: {prefix}{key}: must be {kind.__name__}, got {value!r}; allowed: {allowed}")
        problem = check(value) if check is not None else None
        if problem:
            raise RegionsError(f"{path}: {prefix}{key}: {problem}; allowed: {allowed}")
        out[key] = value
    return out
