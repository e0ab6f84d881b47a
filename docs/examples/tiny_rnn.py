"""A model of your own in plain torch: a one-layer GRU language model, the contract at its smallest.

In regions.yaml (or ``ddctl train --model``)::

    training:
      model: docs/examples/tiny_rnn.py:build

The factory takes the job's ModelConfig (its vocab_size and seq_len are the data's; d_model is
used here as the width) and builds on the CPU from torch's seeded generator; forward returns the
loss alone, a scalar tensor, which is also what val_bpb reads. The contract is in
``agents/ddctl_agents/train/contract.py``; ``ddctl up --plan`` checks it on the laptop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from ddctl_agents.train.config import ModelConfig


class TinyRNN(nn.Module):
    """Embed each token, run a GRU over the sequence, project every step to next-token scores."""

    def __init__(self, vocab_size: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.rnn = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy in nats: ``targets`` are already the following tokens."""
        hidden, _ = self.rnn(self.embed(tokens))
        logits = self.head(hidden)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build(config: ModelConfig) -> TinyRNN:
    """The factory ``training.model`` names."""
    return TinyRNN(config.vocab_size, config.d_model)
