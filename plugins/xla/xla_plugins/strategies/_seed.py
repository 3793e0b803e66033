"""Seeding the XLA device's random number generator from torch's seed, as torch seeds CUDA devices."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import Module


def seed_device(device: Any) -> int:
    """Seed ``device``'s XLA RNG (dropout and every random op on it) with ``torch.initial_seed()``; return it.

    ``torch.manual_seed(s)`` (and so Lightning's ``seed_everything(s)``, ``Fabric.seed_everything``
    and ``LightningCLI``'s ``seed_everything``) seeds every CUDA device with ``s``, but not the XLA
    RNG (``xm.set_rng_state``), whose seed is fixed otherwise. Every device and every rank gets the
    same seed, as Lightning's DDP gives every rank the same ``PL_GLOBAL_SEED``.
    """
    import torch_xla.core.xla_model as xm

    seed = torch.initial_seed()
    xm.set_rng_state(seed, str(device))
    return seed


class SeedsDeviceAtSetup:
    """Mixin for Trainer strategies: seed the device when the run's environment is set up.

    Lightning's DDP re-seeds every rank from ``PL_GLOBAL_SEED`` at the same point, once per
    ``fit``/``validate``/``test``/``predict``.
    """

    root_device: Any

    def setup_environment(self) -> None:
        super().setup_environment()  # type: ignore[misc]
        seed_device(self.root_device)


class SeedsDeviceWithModule:
    """Mixin for Fabric strategies: seed the device when a module is moved to it.

    Fabric users seed (``fabric.seed_everything``) after ``launch()`` and before ``setup``, so each
    ``setup``/``setup_module`` starts the device RNG from the seed last set, as the seeding itself
    starts CUDA's.
    """

    root_device: Any

    def module_to_device(self, module: Module) -> None:
        seed_device(self.root_device)
        super().module_to_device(module)  # type: ignore[misc]
