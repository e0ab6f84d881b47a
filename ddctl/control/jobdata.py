"""The job's data and model as the control plane sees them: checked before anything starts, readable where the job runs.

Local paths (text or token shards) are read by the job's processes at the same paths: a local
process has them, a Docker VM gets them bound read-only (``InstanceSpec.mounts``). A cloud VM
cannot read this machine's files, so a cloud region with local data is refused here, naming the
path and the way out (object storage). Tokenised data must have the model's vocabulary, also
checked here from the shards' sidecars, before any machine is made.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import torch

from ddctl import providers
from ddctl.errors import DdctlError
from ddctl_agents import storage
from ddctl_agents.core.text import printable
from ddctl_agents.errors import CheckpointError
from ddctl_agents.train.config import InnerConfig, ModelConfig
from ddctl_agents.train.contract import build, check_contract
from ddctl_agents.train.data import dataset_vocab_size
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.model import GPT
from ddctl_agents.train.presets import model_config


def local_data(job: JobConfig) -> tuple[str, ...]:
    """The directories of this machine the job's data lives in (a file's own folder), sorted, each once."""
    named = [str(p) for p in job.data.paths] + [p for p in job.data.token_paths if not storage.is_remote(p)]
    folders = {str(path if path.is_dir() else path.parent) for path in (Path(p).resolve() for p in named)}
    return tuple(sorted(folders))


def check_data(job: JobConfig, kinds: dict[str, str]) -> None:
    """Refuse, before anything starts, data a region cannot read, tokens the model cannot embed, and a model of
    yours that breaks its contract (``train/contract.py``)."""
    clouds = sorted({kind for kind in kinds.values() if not providers.KINDS[kind].local})
    local = local_data(job)
    if clouds and local:
        raise DdctlError(
            f"training data {local[0]} is on this machine, which {' and '.join(clouds)} VMs cannot read; "
            "put it in object storage and name it there (training.token_data: [s3://BUCKET/PREFIX] or gs://...)"
        )
    if job.inner.model:  # your model, built and run once here: a broken contract fails now, not on a VM later
        check_contract(job.inner.model, model_config(job.inner), fragments=job.sync.fragments)
    if job.data.token_paths:
        need, have = dataset_vocab_size(job.data), model_config(job.inner).vocab_size
        if need != have:
            raise DdctlError(
                f"training.vocab_size: the model's vocabulary is {have} but training.token_data's is {need}; "
                f"set training.vocab_size: {need}"
            )


def builtin_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The built-in model's parameter shapes for ``config``, from the meta device (nothing allocated)."""
    with torch.device("meta"):
        return {n: tuple(p.shape) for n, p in GPT(config).named_parameters()}


MOST_LAYERS = 1024
MOST_MLPS = 16_384
"""A checkpoint's model config may name at most this many blocks, and MLPs (a block's experts each one) in all:
far above any preset (20 blocks, 4 experts), far below where building it on the meta device takes minutes."""


def builtin_parameters(config: ModelConfig) -> int:
    """The built-in model's parameter count for ``config``, by arithmetic (``model.GPT``), nothing built."""
    d, hidden = config.d_model, config.mlp_ratio * config.d_model
    mlp = 2 * d * hidden + hidden + d
    ffn = d * config.n_experts + config.n_experts * mlp if config.n_experts else mlp
    block = 4 * d + 4 * d * d + 4 * d + ffn  # two LayerNorms, attention's qkv and output projections, the MLP(s)
    head = 0 if config.tie_embeddings else config.vocab_size * d
    return (config.vocab_size + config.seq_len) * d + config.n_layer * block + 2 * d + head


def checkpoint_shapes(config: ModelConfig, model_bytes: int, file: str, whole: bool = True) -> dict[str, tuple[int, ...]]:
    """The built-in model's shapes for a checkpoint's model config, built only once the config is one its model
    file (``file``, ``model_bytes`` as its manifest says, float32) can hold: a manifest comes from another machine,
    and a config of 2**40 wide or 10**7 blocks would otherwise take all memory or hours before any byte is compared."""
    mlps = config.n_layer * max(1, config.n_experts)
    if config.n_layer > MOST_LAYERS or mlps > MOST_MLPS:
        raise CheckpointError(
            f"{file}: its model config has {config.n_layer} blocks of {max(1, config.n_experts)} MLPs; "
            f"at most {MOST_LAYERS} blocks and {MOST_MLPS} MLPs in all are read"
        )
    need = 4 * builtin_parameters(config)
    if whole and need > model_bytes:  # a shard's part (not whole) holds only its fragments
        raise CheckpointError(
            f"{file}: its model config has {need // 4} parameters ({need} bytes as float32), more than the "
            f"{model_bytes} bytes the manifest gives it"
        )
    try:
        return builtin_shapes(config)
    except (RuntimeError, MemoryError, OverflowError, ValueError) as exc:
        raise CheckpointError(f"{file}: its model config cannot be built: {printable(str(exc))}") from None


@functools.cache
def model_shapes(inner: InnerConfig) -> Mapping[str, tuple[int, ...]]:
    """The parameters the job's model has, by name: the built-in's from its config, yours built once on the CPU (as
    the syncer builds it); once per process, as plan, quotes and resume all ask."""
    config = model_config(inner)
    if not inner.model:
        return MappingProxyType(builtin_shapes(config))
    return MappingProxyType({n: tuple(p.shape) for n, p in build(config, inner, inner.seed).named_parameters()})
