"""The smallest Lightning model for checkpoint-write tests: one ``nn.Linear(4, 1)`` fitted with SGD.

Shared by tests/test_async_checkpoints.py and tests/scripts/spawn_writes.py (which puts this folder
on ``sys.path``); what those tests count is writes and steps, never the loss.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data(samples: int = 64) -> DataLoader:
    """``samples`` pairs (x of shape (4,), y of shape (1,)) from a seeded generator, in batches of 4."""
    generator = torch.Generator().manual_seed(1)
    return DataLoader(
        TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator)),
        batch_size=4,
    )
