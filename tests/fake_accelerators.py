"""Accelerator classes for tests of third-party accelerators (a CPU in disguise)."""

from __future__ import annotations

import torch
from lightning.pytorch.accelerators import CPUAccelerator


class FakeAccelerator(CPUAccelerator):
    """Runs on the CPU but is not Lightning's: the connector must treat it as a plugin's accelerator."""

    @staticmethod
    def get_parallel_devices(devices):
        count = devices if isinstance(devices, int) else len(devices)
        return [torch.device("cpu")] * count

    @staticmethod
    def name() -> str:
        return "fake"


class SubFakeAccelerator(FakeAccelerator):
    """A subclass, to check ownership along the MRO."""
