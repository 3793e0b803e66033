"""The plain module and data of tests/scripts/fsdp_v2.py, in torch only: checkpoints are checked without torch_xla."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

SIZE = 96


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Net(nn.Module):
    """The plain module: a 256x256 weight (``block.linear.weight``) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SIZE, 256, generator=generator)
    return TensorDataset(x, x[:, :4].sum(1, keepdim=True))
