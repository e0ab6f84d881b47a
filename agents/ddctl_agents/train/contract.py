"""The model contract: what ``training.model: MODULE:FACTORY`` must name, how it is loaded and checked.

The contract (the built-in GPT of ``train/model.py`` is the default and keeps it):

1. ``FACTORY(config: ModelConfig) -> torch.nn.Module``. ``config`` is the job's preset with the
   vocab_size and seq_len it trains with; its other fields are yours to use or ignore. The caller
   seeds torch's default CPU generator with the job's seed just before the call (and restores it
   after), so build on the CPU and draw randomness from that generator only (not ``random``,
   numpy or the clock): the syncer and every learner must build the identical initial model.
2. ``module(tokens, targets)``: two (batch, time) int64 tensors, time <= seq_len, ``targets[:, t]``
   the token after ``tokens[:, t]`` (already shifted: do not shift again). It returns the loss as a
   scalar tensor, or an object with ``.loss`` (the scalar training minimises) and optionally ``.ce``
   (the mean next-token cross-entropy in nats per target token, behind val_bpb; default: ``.loss``).
   Every target counts, so the loss is a mean over batch x time and needs no token count. In
   training mode the forward must be deterministic (no dropout): runs replay bit for bit.
3. Parameters are what the syncer merges, fragment by fragment, by name: at least one, float32
   (autocast does the bf16 arithmetic), names of 1-256 characters, at most 8 dimensions. Every one
   gets a gradient from the loss, except the names an optional ``unused_parameters`` attribute
   lists. Buffers are not synchronised, so training must not change them (no running statistics).
4. Optional ``blocks``, an ``nn.ModuleList``: with ``--shard``, FSDP2 shards each block as one unit;
   without it the whole model is one unit.
5. Optional ``embedding_names``, parameter names whose rows train sparsely: the outer merge averages
   them plainly instead of radially. Default: the weights of its ``nn.Embedding`` modules, as the built-in.
6. MFU counts 6 x parameters FLOPs per token for a model of your own (``train/flops.py``).

A spec is ``package.module:factory`` (importable, or shipped) or ``path/to/file.py:factory``; a
module part ending in ``.py`` is a file. ``train/modelfiles.py`` carries its source to the VMs.
``check_contract`` runs every rule on the CPU at ``up --plan`` time, so a broken factory fails on the
laptop, each violation a ContractError naming its rule.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ddctl_agents.core.fragments import TensorSpec, fragment_tensors
from ddctl_agents.core.wire import WireLimits
from ddctl_agents.errors import AgentError, ContractError
from ddctl_agents.train import flops
from ddctl_agents.train.config import MODEL_SPEC, InnerConfig, ModelConfig
from ddctl_agents.train.model import build_model, embedding_names

Factory = Callable[[ModelConfig], nn.Module]
MAX_NAME = 256
"""Longest parameter name the wire format's tensor table takes."""


def refusal(rule: str, message: str) -> ContractError:
    """The error for a broken ``rule`` (a word of the module docstring's rules: spec, load, factory, output, ...)."""
    return ContractError(message, rule)


def split_spec(spec: str) -> tuple[str, str]:
    """(module or file, factory) of a spec; a malformed one is refused naming both forms."""
    match = MODEL_SPEC.fullmatch(spec)
    if match is None:
        raise refusal("spec", f"{spec!r} is not package.module:factory or path/to/file.py:factory")
    return match["where"], match["factory"]


def load_factory(spec: str, search: Path | None = None) -> Factory:
    """The factory ``spec`` names, imported with ``search`` (the job's shipped ``model/``) first on sys.path."""
    where, name = split_spec(spec)
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise refusal("load", f"{spec}: no file {path}")
        if not path.stem.isidentifier():
            raise refusal("spec", f"{spec}: {path.name} cannot be imported; name the file like a Python module")
        where, search = path.stem, path.parent
    module = _import(spec, where, search)
    factory = getattr(module, name, None)
    if factory is None:
        raise refusal("load", f"{spec}: module {where} has no attribute {name!r}")
    if not callable(factory):
        raise refusal("load", f"{spec}: {where}.{name} is a {type(factory).__name__}, not a callable factory")
    return factory  # type: ignore[no-any-return]


def _import(spec: str, name: str, search: Path | None) -> Any:
    """Import ``name``, from ``search`` first when given (a copy imported earlier from elsewhere is forgotten)."""
    if search is not None:
        root = search.resolve()
        if sys.path[:1] != [str(root)]:  # first, even if an earlier load put it further down
            sys.path[:] = [str(root), *(entry for entry in sys.path if entry != str(root))]
        _forget_elsewhere(name.partition(".")[0], root)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
            looked = f"{search} and the installed packages" if search is not None else "the installed packages"
            raise refusal("load", f"{spec}: no module {name} (looked in {looked})") from None
        raise refusal("load", f"{spec}: importing {name} failed: {exc}") from None
    except Exception as exc:  # the user's module runs here: any failure is theirs to fix, named
        raise refusal("load", f"{spec}: importing {name} raised {type(exc).__name__}: {exc}") from None


def _forget_elsewhere(top: str, root: Path) -> None:
    """Drop ``top`` and its submodules from sys.modules when ``root`` holds it and they came from elsewhere."""
    loaded = getattr(sys.modules.get(top), "__file__", None)
    shipped = (root / top).is_dir() or (root / f"{top}.py").is_file()
    if loaded is not None and shipped and not Path(loaded).resolve().is_relative_to(root):
        for module in [m for m in sys.modules if m == top or m.startswith(f"{top}.")]:
            del sys.modules[module]
    importlib.invalidate_caches()


def build(config: ModelConfig, inner: InnerConfig, seed: int, search: Path | None = None) -> nn.Module:
    """The job's model at the seed's initialisation: the built-in, or ``inner.model``'s factory."""
    if not inner.model:
        return build_model(config, seed)
    return _call(inner.model, load_factory(inner.model, search), config, seed)


def _call(spec: str, factory: Factory, config: ModelConfig, seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        torch.default_generator.manual_seed(seed)
        try:
            model = factory(config)
        except AgentError:
            raise
        except Exception as exc:
            raise refusal("factory", f"{spec}: the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise refusal("factory", f"{spec}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def training_loss(out: object) -> Tensor:
    """What training minimises: the output itself when a tensor, else its ``.loss``."""
    loss = out if isinstance(out, Tensor) else getattr(out, "loss", None)
    if not isinstance(loss, Tensor):
        raise refusal("output", f"forward returned a {type(out).__name__}: give a scalar tensor or an object with .loss")
    return loss


def quality_loss(out: object) -> Tensor:
    """The mean cross-entropy behind val_bpb: ``.ce`` where the output has one, else the training loss."""
    ce = getattr(out, "ce", None)
    return ce if isinstance(ce, Tensor) else training_loss(out)


def embeddings_of(model: nn.Module) -> frozenset[str]:
    """Parameter names the outer merge averages plainly: ``model.embedding_names`` or its nn.Embedding weights."""
    declared = getattr(model, "embedding_names", None)
    if declared is None:
        names = {name for name, _ in model.named_parameters()}
        return frozenset(embedding_names(model) & names)
    return frozenset(declared() if callable(declared) else declared)


def model_flops(inner: InnerConfig, config: ModelConfig, params: int) -> int:
    """Training FLOPs per token: the built-in's exact count, or 6 x parameters for a model of your own."""
    return flops.custom_flops_per_token(params) if inner.model else flops.flops_per_token(config)


def check_contract(spec: str, config: ModelConfig, search: Path | None = None, *, fragments: int = 0) -> dict[str, Any]:
    """Every rule of the module docstring on a tiny CPU batch; ``fragments``: also check the job's layout fits."""
    inner = InnerConfig(model=spec)
    first, again = build(config, inner, 0, search), build(config, inner, 0, search)
    named = dict(first.named_parameters())
    _check_parameters(spec, named)
    _check_same(spec, named, dict(again.named_parameters()))
    unused = _names(spec, "unused_parameters", getattr(first, "unused_parameters", ()), named)
    embeddings = _names(spec, "embedding_names", embeddings_of(first), named)
    blocks = getattr(first, "blocks", None)
    if blocks is not None and not isinstance(blocks, nn.ModuleList):
        raise refusal("blocks", f"{spec}: .blocks is a {type(blocks).__name__}; allowed: an nn.ModuleList, or none")
    tokens, targets = _batch(config)
    buffers = {name: b.detach().clone() for name, b in first.named_buffers()}
    first.train()
    loss = _scalar(spec, "loss", training_loss(_forward(spec, first, tokens, targets)), grad=True)
    _check_backward(spec, first, loss, unused)
    again.train()
    replayed = training_loss(_forward(spec, again, tokens, targets))
    if not torch.equal(loss.detach(), replayed.detach()):
        raise refusal("determinism", f"{spec}: one batch, two forwards, two losses ({loss}, {replayed}); no dropout")
    for name, before in buffers.items():
        if not torch.equal(before, first.get_buffer(name)):
            raise refusal("buffers", f"{spec}: training changed buffer {name}; buffers are not synchronised")
    first.eval()
    with torch.no_grad():
        _scalar(spec, "ce", quality_loss(_forward(spec, first, tokens, targets)), grad=False)
    if fragments:
        specs = [TensorSpec(name=n, shape=tuple(p.shape), is_embedding=n in embeddings) for n, p in named.items()]
        try:
            fragment_tensors(specs, fragments)
        except AgentError as exc:
            raise refusal("fragments", f"{spec}: {len(specs)} tensors cannot make {fragments} fragments: {exc}") from None
    params = sum(p.numel() for p in named.values())
    return {
        "params": params,
        "tensors": len(named),
        "flops_per_token": model_flops(inner, config, params),
        "blocks": blocks is not None,
        "embeddings": sorted(embeddings),
    }


def _check_parameters(spec: str, named: dict[str, nn.Parameter]) -> None:
    if not named:
        raise refusal("parameters", f"{spec}: the model has no parameters; the syncer merges parameters, give it some")
    rank = WireLimits().max_rank
    for name, param in named.items():
        if not 0 < len(name) <= MAX_NAME:
            raise refusal("parameters", f"{spec}: parameter name {name[:40]!r}... is over {MAX_NAME} characters")
        if param.dtype != torch.float32:
            raise refusal("parameters", f"{spec}: {name} is {param.dtype}; parameters must be float32 (autocast does bf16)")
        if param.ndim > rank:
            raise refusal("parameters", f"{spec}: {name} has {param.ndim} dimensions; at most {rank}")
        if param.device.type != "cpu":
            raise refusal("parameters", f"{spec}: {name} is on {param.device}; build on the CPU (training moves it)")


def _check_same(spec: str, first: dict[str, nn.Parameter], again: dict[str, nn.Parameter]) -> None:
    if list(first) != list(again):
        raise refusal("determinism", f"{spec}: two builds with one seed named different parameters")
    for name, param in first.items():
        if param.shape != again[name].shape or not torch.equal(param, again[name]):
            raise refusal(
                "determinism",
                f"{spec}: two builds with one seed differ at {name}; draw randomness from torch's seeded generator only",
            )


def _names(spec: str, attribute: str, names: Iterable[str], named: dict[str, nn.Parameter]) -> frozenset[str]:
    chosen = frozenset(names)
    stray = sorted(chosen - set(named))
    if stray:
        raise refusal(attribute, f"{spec}: .{attribute} lists {', '.join(stray[:3])}, not parameter names")
    return chosen


def _batch(config: ModelConfig) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (2, min(8, config.seq_len))
    tokens = torch.randint(0, config.vocab_size, shape, generator=generator)
    return tokens, torch.randint(0, config.vocab_size, shape, generator=generator)


def _forward(spec: str, model: nn.Module, tokens: Tensor, targets: Tensor) -> object:
    try:
        return model(tokens, targets)
    except Exception as exc:
        raise refusal("forward", f"{spec}: forward(tokens, targets) raised {type(exc).__name__}: {exc}") from None


def _scalar(spec: str, what: str, value: Tensor, *, grad: bool) -> Tensor:
    if value.ndim != 0 or not value.is_floating_point():
        raise refusal("output", f"{spec}: the {what} is {value.dtype} of shape {tuple(value.shape)}; allowed: one float")
    if not math.isfinite(float(value.detach())):
        raise refusal("output", f"{spec}: the {what} is {float(value.detach())} on a random batch; it must be finite")
    if grad and not value.requires_grad:
        raise refusal("output", f"{spec}: the {what} does not require grad; compute it from the parameters, not detached")
    return value


def _check_backward(spec: str, model: nn.Module, loss: Tensor, unused: frozenset[str]) -> None:
    try:
        loss.backward()  # type: ignore[no-untyped-call]
    except Exception as exc:
        raise refusal("backward", f"{spec}: loss.backward() raised {type(exc).__name__}: {exc}") from None
    for name, param in model.named_parameters():
        if name in unused:
            continue
        if param.grad is None:
            raise refusal("gradients", f"{spec}: {name} got no gradient; use it in the loss or list it in .unused_parameters")
        if not bool(torch.isfinite(param.grad).all()):
            raise refusal("gradients", f"{spec}: the gradient of {name} is not finite")


__all__ = [
    "Factory",
    "build",
    "check_contract",
    "embeddings_of",
    "load_factory",
    "model_flops",
    "quality_loss",
    "refusal",
    "split_spec",
    "training_loss",
]
