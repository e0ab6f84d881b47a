"""A Hugging Face causal LM as a model of your own: GPT-2's architecture from a local config, no download.

In regions.yaml (``pip install transformers`` on the laptop and in the VM image)::

    training:
      model: docs/examples/hf_model.py:build

Three things adapt a ``transformers`` model to the contract (``agents/ddctl_agents/train/contract.py``):
the loss is computed here from the logits, because ddctl's targets are already shifted and the
model's own ``labels=`` would shift them again; dropout is off, because training must be
deterministic; and ``blocks`` points at the transformer layers so that ``--shard`` puts each in an
FSDP2 unit of its own. Initialisation is ``transformers``' own, from torch's seeded generator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GPT2Config, GPT2LMHeadModel

if TYPE_CHECKING:
    from ddctl_agents.train.config import ModelConfig


class Output(NamedTuple):
    """What the contract reads: ``loss`` to train, ``ce`` for val_bpb (the same here: no auxiliary loss)."""

    loss: Tensor
    ce: Tensor


class HFCausalLM(nn.Module):
    """``GPT2LMHeadModel`` shaped by the job's preset, behind ddctl's forward(tokens, targets)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hf = GPT2Config(
            vocab_size=config.vocab_size,
            n_positions=config.seq_len,
            n_embd=config.d_model,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_inner=config.mlp_ratio * config.d_model,
            activation_function="gelu",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,  # GPT-2's 50256 lies outside a byte vocabulary
            eos_token_id=0,
            tie_word_embeddings=config.tie_embeddings,
        )
        self.lm = GPT2LMHeadModel(hf)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer layers, one FSDP2 unit each under ``--shard``."""
        return self.lm.transformer.h

    def forward(self, tokens: Tensor, targets: Tensor) -> Output:
        logits = self.lm(input_ids=tokens, use_cache=False).logits
        ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return Output(loss=ce, ce=ce)


def build(config: ModelConfig) -> HFCausalLM:
    """The factory ``training.model`` names."""
    return HFCausalLM(config)
