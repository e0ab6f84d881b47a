"""regions.yaml: which regions a job runs in, how they are linked, and the training knobs.

The file is read into pydantic models (no unknown keys, strict types, bounds)
and the first problem is reported as ``FILE: KEY.PATH: what is wrong; allowed:
...`` with a did-you-mean for typos, so a bad file never reaches a provider.
The ``training:`` section holds the knobs of :mod:`ddctl.config.job` and is
checked by building the job from it, so a value the job refuses is reported
against its key too. The loaded value is typed and frozen.
"""

from __future__ import annotations

import difflib
import json
import typing
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddctl.config import synchronizer
from ddctl.config.job import KnobError, build_job, knobs_model
from ddctl.config.synchronizer import Strict, SynchronizerSection
from ddctl.config.yamlfile import read_yaml
from ddctl.errors import RegionsError
from ddctl.providers import instance_gpus
from ddctl_agents import storage
from ddctl_agents.errors import AgentError
from ddctl_agents.train.job import JobConfig

Provider = Literal["aws", "gcp", "docker", "process"]
PROVIDERS: tuple[str, ...] = typing.get_args(Provider)
LOCAL_PROVIDERS = ("docker", "process")
CLOUD_PROVIDERS = ("aws", "gcp")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$"
"""A run's or a region's name: it names folders, object keys and cloud resources."""
Name = Annotated[str, Field(pattern=NAME_PATTERN, description="letters, digits, '-' or '_' (a name)")]


_Model = Strict


class LinkProfile(_Model):
    """The WAN link a local region emulates."""

    up_mbps: Annotated[float, Field(gt=0, description="a number > 0")]
    down_mbps: Annotated[float, Field(gt=0, description="a number > 0")]
    latency_ms: Annotated[float, Field(ge=0, description="a number >= 0")] = 0.0


class PreemptionProfile(_Model):
    """How often a local region's learners are preempted, and with how much notice."""

    mean_between_s: Annotated[float, Field(gt=0, description="a number > 0")]
    notice_s: Annotated[float, Field(ge=0, description="a number >= 0")]


class PriceOverride(_Model):
    """Prices the file sets for a region, over the provider's table (USD per instance-hour)."""

    spot_per_hour: Annotated[float | None, Field(ge=0, description="USD per spot instance-hour, a number >= 0")] = None
    on_demand_per_hour: Annotated[float | None, Field(ge=0, description="USD per on-demand instance-hour, a number >= 0")] = None


class Region(_Model):
    name: Name
    provider: Annotated[Provider, Field(description=" | ".join(PROVIDERS))]
    learners: Annotated[int, Field(ge=1, description="an integer >= 1")] = 1
    cloud_region: Annotated[str, Field(description="a cloud region such as us-east-1")] = ""
    fallback_regions: Annotated[
        tuple[str, ...], Field(description="cloud regions to try, in order, when cloud_region has no capacity")
    ] = ()
    zones: Annotated[tuple[str, ...], Field(description="an ordered list of zones to try")] = ()
    instance_type: Annotated[str, Field(description="an instance type such as g5.xlarge")] = ""
    instance_types: Annotated[
        tuple[str, ...], Field(description="instance types in order of preference, such as [g6.xlarge, g5.xlarge]")
    ] = ()
    image: Annotated[
        str,
        Field(
            description="a machine image: aws: an AMI id (ami-...) or ssm:/path/of/a/public/parameter; "
            "gcp: an image URL such as projects/debian-cloud/global/images/family/debian-12"
        ),
    ] = ""
    vpc: Annotated[
        str, Field(description="aws: a VPC id (vpc-...) or Name tag; gcp: a VPC network name; default: the default one")
    ] = ""
    project: Annotated[str, Field(description="gcp: the project id; default: GOOGLE_CLOUD_PROJECT")] = ""
    python: Annotated[str, Field(description="the interpreter on the VMs, an absolute path")] = ""
    accelerator: Annotated[str, Field(description="an accelerator such as nvidia-l4")] = ""
    accelerator_count: Annotated[int, Field(ge=1, le=16, description="accelerators per VM, an integer 1..16")] = 1
    gpus: Annotated[
        int | None,
        Field(ge=1, le=64, description="ranks (GPUs) per learner, an integer 1..64; default: the VM's GPUs, else 1"),
    ] = None
    nodes: Annotated[
        int, Field(ge=1, le=64, description="VMs per learner, an integer 1..64 (each runs gpus ranks; torchrun's c10d)")
    ] = 1
    disk_gb: Annotated[int, Field(ge=10, le=65536, description="the boot disk in GB, an integer 10..65536")] = 50
    prices: Annotated[PriceOverride | None, Field(description="{spot_per_hour, on_demand_per_hour}")] = None
    spot: Annotated[bool, Field(description="true or false")] = True
    price_cap: Annotated[float | None, Field(gt=0, description="USD per instance-hour, a number > 0")] = None
    """USD per instance-hour we are willing to pay (spot bids above it are refused)."""
    link: Annotated[LinkProfile | None, Field(description="{up_mbps, down_mbps, latency_ms}")] = None
    preemption: Annotated[PreemptionProfile | None, Field(description="{mean_between_s, notice_s}")] = None
    cadence: Annotated[int | Literal["auto"], Field(description="auto, or send every 1, 2, 4 or 8 outer periods")] = "auto"

    @property
    def types(self) -> tuple[str, ...]:
        """The instance types to try, in order (``instance_type`` is the one-type shorthand)."""
        return self.instance_types or ((self.instance_type,) if self.instance_type else ())

    @property
    def ranks(self) -> int:
        """Processes, one per GPU, that together are one learner: ``gpus``, else the VM's GPUs, else 1."""
        if self.gpus is not None:
            return self.gpus
        known = vm_gpus(self)
        return known[0] if known is not None else 1

    @property
    def world(self) -> int:
        """Ranks in one learner, over all its VMs: the batch is split across them."""
        return self.ranks * self.nodes


def vm_gpus(region: Region) -> tuple[int, str] | None:
    """The fewest GPUs a VM of ``region`` has, and a phrase that says so; None when no GPU is known.

    ``up`` may launch any of the region's types and a learner's ranks are fixed before it knows which,
    so the fewest bounds them. A type that comes with GPUs counts its own (the provider's tables);
    any other the file's ``accelerator_count`` when it names an ``accelerator``."""
    found = []
    for kind in region.types or ("",):
        own = instance_gpus(region.provider, kind)
        if own is not None:
            found.append((own[1], f"{kind} comes with {_plural(own[1], f'{own[0]} GPU')}"))
        elif region.accelerator:
            n = region.accelerator_count
            found.append((n, f"the VM has {_plural(n, f'{region.accelerator} accelerator')}"))
    return min(found, default=None)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class Checkpoints(_Model):
    """When the syncer checkpoints the global model, which it keeps, and where else it writes them."""

    every_rounds: Annotated[int, Field(ge=0, description="after this many merged rounds, an integer >= 0 (0: not)")] = 0
    every_minutes: Annotated[float, Field(ge=0, description="after this many minutes, a number >= 0 (0: not)")] = 10.0
    keep_last: Annotated[int, Field(ge=1, le=10_000, description="the newest to keep, an integer 1..10000")] = 3
    keep_every: Annotated[int, Field(ge=0, description="also keep every Nth, an integer >= 0 (0: none)")] = 0
    url: Annotated[str, Field(description="also write them under s3://BUCKET/PREFIX or gs://BUCKET/PREFIX (per run)")] = ""


class RegionsFile(_Model):
    path: Annotated[Path, Field(exclude=True)] = Path("regions.yaml")
    run: Annotated[Name, Field(description="a name for the run (its resources carry it)")] = "ddctl"
    syncer: Annotated[str, Field(description="the name of one of the regions (or a synchronizer: section)")] = ""
    synchronizer: Annotated[SynchronizerSection | None, Field(description="{shards, regions, relays, replan}")] = None
    training: Annotated[dict[str, Any], Field(description="the training knobs")] = Field(default_factory=dict)
    regions: Annotated[tuple[Region, ...], Field(min_length=1, description="a list of regions")]
    checkpoints: Annotated[Checkpoints, Field(description="{every_rounds, every_minutes, keep_last, keep_every, url}")] = (
        Checkpoints()
    )

    @property
    def learners(self) -> int:
        return sum(r.learners for r in self.regions)

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise RegionsError(f"{self.path}: no region named {name!r}; regions: {', '.join(r.name for r in self.regions)}")


DATA_KNOBS = ("data", "token_data")
"""Knobs that name data: a relative path is relative to the regions file (the job's processes run elsewhere)."""


def job_config(rf: RegionsFile) -> JobConfig:
    """The JobConfig every process of this job agrees on: the training knobs, one learner slot per instance."""
    knobs = dict(rf.training)
    for knob in DATA_KNOBS:
        if isinstance(knobs.get(knob), list):
            knobs[knob] = [
                p if not isinstance(p, str) or "://" in p else str((rf.path.parent / p).resolve()) for p in knobs[knob]
            ]
    model = knobs.get("model")
    if isinstance(model, str) and ":" in model and model.rpartition(":")[0].endswith(".py"):  # a file: relative to us
        where, _, factory = model.rpartition(":")
        knobs["model"] = f"{(rf.path.parent / where).resolve()}:{factory}"
    try:
        return build_job({**knobs, "learners": rf.learners})
    except KnobError as exc:
        if exc.knob == "learners":  # not a training key: the regions' learners added up
            raise RegionsError(f"{rf.path}: regions: their learners add up to {rf.learners}; {exc.problem}", path=rf.path,
                               key="regions") from None  # fmt: skip
        raise RegionsError(f"{rf.path}: training.{exc.knob}: {exc.problem}", path=rf.path, key=f"training.{exc.knob}") from None
    except AgentError as exc:
        raise RegionsError(f"{rf.path}: training: {exc}", path=rf.path, key="training") from None


def load_regions(path: Path) -> RegionsFile:
    """Read and validate ``path``; any problem is a RegionsError naming file, key and what is allowed."""
    raw = read_yaml(path, RegionsError, "a regions file")
    return parse_regions(raw, path)


def parse_regions(raw: Any, path: Path) -> RegionsFile:
    if not isinstance(raw, dict):
        raise RegionsError(f"{path}: the file: must be a mapping of keys {', '.join(_keys(RegionsFile))}", path=path)
    try:
        text = json.dumps(raw)  # validated as JSON: YAML lists become tuples, strict types still hold
    except (TypeError, ValueError) as exc:
        raise RegionsError(f"{path}: holds a value that is not plain data ({exc})", path=path) from None
    try:
        rf = RegionsFile.model_validate_json(text).model_copy(update={"path": path})
    except ValidationError as exc:
        raise _explain(exc, path, ()) from None
    try:
        _training_model().model_validate_json(json.dumps(rf.training))
    except ValidationError as exc:
        raise _explain(exc, path, ("training",)) from None
    _check_consistency(rf)
    job = job_config(rf)  # a value the job refuses is reported against its key now, not when the job starts
    _check_ranks(rf, job.inner.batch_size)
    if rf.synchronizer is not None:  # the plan's first shard is where the synchronizer process runs
        rf = rf.model_copy(update={"syncer": synchronizer.shard_plan(rf, job).shards[0].site})
    return rf


@cache
def _training_model() -> type[BaseModel]:
    """The knobs regions.yaml may set: all but ``learners``, which the regions' learner counts decide."""
    from pydantic import create_model

    fields = {k: (f.annotation, None) for k, f in knobs_model().model_fields.items() if k != "learners"}
    model: type[BaseModel] = create_model("training", __config__=ConfigDict(extra="forbid", strict=True), **fields)  # type: ignore[call-overload]
    return model


def _check_consistency(rf: RegionsFile) -> None:
    if rf.checkpoints.url:
        if not storage.is_remote(rf.checkpoints.url):
            raise RegionsError(
                f"{rf.path}: checkpoints.url: {rf.checkpoints.url!r} is not object storage; allowed: s3://BUCKET/PREFIX "
                "or gs://BUCKET/PREFIX (the syncer's own disk always has them)",
                path=rf.path,
                key="checkpoints.url",
            )
        try:
            storage.check(rf.checkpoints.url)
        except storage.StorageError as exc:
            raise RegionsError(f"{rf.path}: checkpoints.url: {exc}", path=rf.path, key="checkpoints.url") from None
    names = [r.name for r in rf.regions]
    for name in names:
        if names.count(name) > 1:
            raise RegionsError(
                f"{rf.path}: regions: name {name!r} is used twice; names must be unique", path=rf.path, key="regions"
            )
    synchronizer.check_section(rf)
    if rf.syncer and rf.syncer not in names:
        raise RegionsError(
            f"{rf.path}: syncer: {rf.syncer!r} is not a region here; allowed: {', '.join(names)}", path=rf.path, key="syncer"
        )
    for i, region in enumerate(rf.regions):
        where = f"regions[{i}]"
        if region.provider in CLOUD_PROVIDERS and not region.cloud_region:
            raise RegionsError(
                f"{rf.path}: {where}.cloud_region: required for provider {region.provider!r}", path=rf.path, key=where
            )
        if region.link is not None and region.provider not in LOCAL_PROVIDERS:
            raise RegionsError(
                f"{rf.path}: {where}.link: only local regions emulate links; allowed with: {', '.join(LOCAL_PROVIDERS)}",
                path=rf.path,
                key=f"{where}.link",
            )
        if region.instance_type and region.instance_types:
            raise RegionsError(
                f"{rf.path}: {where}.instance_types: give instance_type or instance_types, not both", path=rf.path, key=where
            )
        if region.python and not region.python.startswith("/"):
            raise RegionsError(
                f"{rf.path}: {where}.python: must be an absolute path, got {region.python!r}", path=rf.path, key=where
            )
        if region.fallback_regions and region.provider not in CLOUD_PROVIDERS:
            raise RegionsError(f"{rf.path}: {where}.fallback_regions: only cloud regions fail over", path=rf.path, key=where)


def _check_ranks(rf: RegionsFile, batch_size: int) -> None:
    """Each learner's ranks fit its VM's GPUs and split the batch evenly (the agent splits it across them)."""
    for i, region in enumerate(rf.regions):
        key = f"regions[{i}].gpus"
        known = vm_gpus(region)
        if region.gpus is not None and known is not None and region.gpus > known[0]:
            raise RegionsError(
                f"{rf.path}: {key}: {region.gpus} ranks but {known[1]}; allowed: 1..{known[0]}", path=rf.path, key=key
            )
        if batch_size % region.world:
            why = "" if region.gpus is not None else " (its VM's GPUs)"
            over = f" on each of {region.nodes} nodes" if region.nodes > 1 else ""
            allowed = "gpus x nodes" if region.nodes > 1 else "a gpus"
            raise RegionsError(
                f"{rf.path}: {key}: region {region.name!r} runs {region.ranks} ranks per learner{why}{over}, which must "
                f"split training.batch_size {batch_size} evenly; allowed: {allowed} that divides {batch_size}",
                path=rf.path,
                key=key,
            )


def _explain(exc: ValidationError, path: Path, prefix: tuple[str, ...]) -> RegionsError:
    """The first validation error as ``FILE: key.path: problem; allowed: ...``."""
    error = exc.errors()[0]
    loc = (*prefix, *(p for p in error["loc"] if not _union_member(p)))
    key = _dotted(loc)
    owner, field = _owner(loc)
    allowed = _allowed(owner, field)
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _keys(owner), n=1) if owner else []
        hint = f"; did you mean {close[0]!r}?" if close else ";"
        problem, allowed = f"unknown key{hint}", ", ".join(_keys(owner)) if owner else ""
        return RegionsError(f"{path}: {key}: {problem} allowed: {allowed}", path=path, key=key)
    if kind == "missing":
        problem = "required"
    elif kind == "literal_error":
        problem = f"unknown {field} {value!r}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        sign = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        limit = next(iter(error.get("ctx", {}).values()), "?")
        problem = f"must be {sign} {limit}"
    elif kind.endswith("_type") or kind.endswith("_parsing"):
        problem = f"must be {kind.removesuffix('_type').removesuffix('_parsing')}, got {value!r}"
    else:
        problem = str(error["msg"]).removeprefix("Value error, ")
    suffix = f"; allowed: {allowed}" if allowed else ""
    return RegionsError(f"{path}: {key}: {problem}{suffix}", path=path, key=key)


def _union_member(part: Any) -> bool:
    """A tag pydantic adds to a location inside a union (``constrained-int``, ``literal['auto']``): not a key."""
    return isinstance(part, str) and (part in ("int", "str", "float", "bool") or "-" in part or "[" in part)


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the file"


def _owner(loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, str]:
    """The model that owns the last key of ``loc``, and that key."""
    model: type[BaseModel] | None = RegionsFile
    names = [p for p in loc if not isinstance(p, int)]
    for part in names[:-1]:
        if model is None:
            return None, str(names[-1])
        if part == "training":
            model = _training_model()
            continue
        info = model.model_fields.get(str(part))
        model = _model_in(info.annotation) if info is not None else None
    return model, str(names[-1]) if names else ""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``tuple[Region, ...]`` or ``LinkProfile | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        inner = _model_in(arg)
        if inner is not None:
            return inner
    return None


def _allowed(model: type[BaseModel] | None, field: str) -> str:
    info = model.model_fields.get(field) if model is not None else None
    return (info.description or "") if info is not None else ""


def _keys(model: type[BaseModel] | None) -> list[str]:
    return [k for k, f in model.model_fields.items() if not f.exclude] if model is not None else []
