"""A decoder-only transformer language model over bytes, in plain torch.

Reads top to bottom: config, attention, MLP, mixture-of-experts, block, model,
then the deterministic builder. Parallelism and optimisation live elsewhere so
this file stays a description of the network.

Run small on a CPU::

    from ddctl_agents.train.model import build_model
    from ddctl_agents.train.config import ModelConfig
    model = build_model(ModelConfig(seq_len=64, d_model=64, n_layer=2, n_head=2), seed=0)
    out = model(idx, targets)   # LMOutput(logits, loss, ce, aux)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddctl_agents.train.config import ModelConfig

INIT_STD = 0.02
"""GPT-2 initialisation scale for weights and embeddings."""

POSITION_EMBEDDING = "wpe.weight"
"""Parameter name of the learned positional embedding (the optimiser exempts it from decay)."""


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


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied tensor counts once)."""
    return sum(p.numel() for p in model.parameters())
