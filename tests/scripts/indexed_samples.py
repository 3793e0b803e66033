"""The data and model of the resume scripts (tests/scripts/exact_resume.py, tests/scripts/resume_positions.py)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class Indexed(Dataset):
    """``size`` samples ``(x, y, index)``, the same in every process (their own generator, not the global one)."""

    def __init__(self, size: int, offset: int) -> None:
        generator = torch.Generator().manual_seed(offset)
        self.x = torch.randn(size, 8, generator=generator)
        self.y = torch.randn(size, 1, generator=generator)
        self.offset = offset

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i + self.offset


def regressor(dropout: float) -> torch.nn.Sequential:
    """A small regressor of the samples' 8 features, with dropout of probability ``dropout`` (none at 0)."""
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.ReLU(),
        torch.nn.Dropout(dropout) if dropout else torch.nn.Identity(),
        torch.nn.Linear(16, 1),
    )
