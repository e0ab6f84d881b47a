"""A decoder-only transformer language model over bytes, in plain torch.

Reads top to bottom: config, attention, MLP, mixture-of-experts, block, model,
then the deterministic builder. Parallelism and optimisation live elsewhere so
this file stays a description of the network.

Run small on a CPU::

    from ddctl_agents.train.model import ModelConfig, build_model
    model = build_model(ModelConfig(seq_len=64, d_model=64, n_layer=2, n_head=2), seed=0)
    out = model(idx, targets)   # LMOutput(logits, loss, ce, aux)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddctl_agents.train.config import require

INIT_STD = 0.02
"""GPT-2 initialisation scale for weights and embeddings."""

POSITION_EMBEDDING = "wpe.weight"
"""Parameter name of the learned positional embedding (the optimiser exempts it from decay)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Shape of the network; every preset is one of these."""

    vocab_size: int = 256
    """Token vocabulary; 256 means raw bytes, so no tokenizer is needed."""
    seq_len: int = 128
    """Context length in tokens (size of the positional embedding)."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layer: int = 4
    """Number of transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide d_model."""
    mlp_ratio: int = 4
    """Hidden width of each MLP (or expert) as a multiple of d_model."""
    n_experts: int = 0
    """Experts per mixture-of-experts layer; 0 means a dense MLP in every block."""
    top_k: int = 2
    """Experts each token is routed to (MoE only)."""
    aux_loss_coef: float = 0.01
    """Weight of the load-balancing loss added to the training loss (MoE only)."""
    tie_embeddings: bool = True
    """Reuse the token embedding as the output projection (saves vocab_size x d_model)."""

    def __post_init__(self) -> None:
        require(self.vocab_size >= 2, f"vocab_size must be >= 2, got {self.vocab_size}")
        require(self.seq_len >= 1, f"seq_len must be >= 1, got {self.seq_len}")
        require(self.d_model >= 1, f"d_model must be >= 1, got {self.d_model}")
        require(self.n_layer >= 1, f"n_layer must be >= 1, got {self.n_layer}")
        require(self.n_head >= 1, f"n_head must be >= 1, got {self.n_head}")
        require(
            self.d_model % self.n_head == 0,
            f"n_head must divide d_model, got n_head={self.n_head}, d_model={self.d_model}",
        )
        require(self.mlp_ratio >= 1, f"mlp_ratio must be >= 1, got {self.mlp_ratio}")
        require(
            self.n_experts == 0 or self.n_experts >= 2,
            f"n_experts must be 0 (dense) or >= 2, got {self.n_experts}",
        )
        if self.n_experts:
            require(
                1 <= self.top_k <= self.n_experts,
                f"top_k must be in [1, n_experts={self.n_experts}], got {self.top_k}",
            )
        require(self.aux_loss_coef >= 0, f"aux_loss_coef must be >= 0, got {self.aux_loss_coef}")


class LMOutput(NamedTuple):
    """What the model returns; `ce` is the pure quality metric, `loss` what training minimises."""

    logits: Tensor
    """(batch, time, vocab) unnormalised next-token scores."""
    loss: Tensor | None
    """ce + aux_loss_coef * aux, or None without targets."""
    ce: Tensor | None
    """Mean next-token cross-entropy in nats, or None without targets."""
    aux: Tensor
    """Mean load-balancing loss over MoE layers (1.0 when perfectly balanced); 0 for dense."""


class CausalSelfAttention(nn.Module):
    """Multi-head attention where each position sees only itself and the past."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.proj(y.transpose(1, 2).reshape(b, t, d))
        return out


class MLP(nn.Module):
    """Position-wise feed-forward: expand, GELU, project back."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.proj(F.gelu(self.fc(x)))
        return out


class Routing(NamedTuple):
    """Where the router sends each token: its top-k experts and their gate weights."""

    weights: Tensor
    """(tokens, top_k) gate weights, a softmax over the chosen experts (rows sum to 1)."""
    experts: Tensor
    """(tokens, top_k) expert indices, distinct within a row."""
    probs: Tensor
    """(tokens, n_experts) full router softmax, used by the load-balancing loss."""


class MoE(nn.Module):
    """Mixture of MLP experts with top-k routing and a Switch-style balancing loss.

    Tokens are dispatched by index: each expert runs only on the tokens routed to
    it, so compute grows with top_k, not with n_experts. The per-expert token
    counts decide tensor shapes, which costs one device-to-host copy per layer on
    a GPU. Every expert is called, even on zero tokens, so all parameters take
    part in the graph (DDP needs no unused-parameter search).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(config) for _ in range(config.n_experts))

    def route(self, x: Tensor) -> Routing:
        """Top-k softmax gating for (tokens, d_model) inputs."""
        probs = F.softmax(self.router(x).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        return Routing(weights / weights.sum(dim=-1, keepdim=True), experts, probs)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Return the mixed expert output and this batch's load-balancing loss."""
        flat_x = x.reshape(-1, x.shape[-1])
        routing = self.route(flat_x)
        slots = routing.experts.flatten()  # expert of each (token, k) slot
        order = slots.argsort(stable=True)  # slots grouped by expert
        token = order // self.top_k
        counts = torch.bincount(slots, minlength=len(self.experts))
        chunks = torch.split(flat_x[token], counts.tolist())
        y = torch.cat([expert(chunk) for expert, chunk in zip(self.experts, chunks, strict=True)])
        y = y * routing.weights.flatten()[order].unsqueeze(1).to(y.dtype)
        out = torch.zeros_like(flat_x).index_add(0, token, y)
        return out.view_as(x), self.balance_loss(counts, routing.probs)

    def balance_loss(self, counts: Tensor, probs: Tensor) -> Tensor:
        """E * sum_i f_i * P_i: f_i the share of routed slots, P_i the mean router probability."""
        fraction = counts.float() / counts.sum()
        return len(self.experts) * (fraction * probs.mean(dim=0)).sum()


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention then feed-forward, both residual."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.ffn: MLP | MoE = MoE(config) if config.n_experts else MLP(config)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Return the new residual stream and the MoE balancing loss (None when dense)."""
        x = x + self.attn(self.ln_1(x))
        if isinstance(self.ffn, MoE):
            out, aux = self.ffn(self.ln_2(x))
            return x + out, aux
        return x + self.ffn(self.ln_2(x)), None


class GPT(nn.Module):
    """Token and position embeddings, a stack of blocks, a final norm and the output head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head: nn.Linear | None = None
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> LMOutput:
        """idx, targets: (batch, time) int64 with time <= seq_len."""
        t = idx.shape[1]
        if t > self.config.seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds seq_len={self.config.seq_len}")
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        aux_terms = []
        for block in self.blocks:
            x, aux = block(x)
            if aux is not None:
                aux_terms.append(aux)
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(self.ln_f(x), head)
        aux = torch.stack(aux_terms).mean() if aux_terms else torch.zeros((), device=idx.device)
        if targets is None:
            return LMOutput(logits, None, None, aux)
        ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return LMOutput(logits, ce + self.config.aux_loss_coef * aux, ce, aux)


def embedding_names(model: nn.Module) -> frozenset[str]:
    """Names of embedding tensors (token, position; the tied output head is the token one).

    The outer merge averages these plainly instead of radially-directionally,
    because their rows are updated sparsely.
    """
    return frozenset(
        f"{name}.weight" if name else "weight" for name, module in model.named_modules() if isinstance(module, nn.Embedding)
    )


def build_model(config: ModelConfig, seed: int) -> GPT:
    """The same seed gives the same weights on every machine, without touching global RNG.

    Modules are created on the meta device (no throwaway default init), then
    filled from a private generator: normal(0, 0.02) for weights and
    embeddings, residual projections scaled by 1/sqrt(2 * n_layer), zero biases,
    unit LayerNorm gains.
    """
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    residual_std = INIT_STD / math.sqrt(2 * config.n_layer)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(".proj") else INIT_STD
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, INIT_STD, generator=generator)
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
    return model


__all__ = [
    "GPT",
    "MLP",
    "POSITION_EMBEDDING",
    "Block",
    "CausalSelfAttention",
    "LMOutput",
    "MoE",
    "ModelConfig",
    "Routing",
    "build_model",
    "embedding_names",
]
