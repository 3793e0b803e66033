"""Seeding the XLA device's random number generator from torch's seed, as torch seeds CUDA devices.

For the Trainer the device is also seeded at the start of every training batch, from the run's seed
and the batch's number in the fit (:func:`batch_seed`). torch_xla's generator advances at every
graph execution (each ``torch_xla.sync()``, also those made by a checkpoint save or a host read),
so without it the dropout masks of a batch would depend on how many graphs ran before it, and a
resumed run, which syncs at other points than the run it continues (no sanity check, a restored
optimizer, a validation run again), could not continue the same stream from a saved state. Seeded
per batch, batch ``i`` draws the same numbers in a run and in any resumption of it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import Module

#: The odd 64-bit constant of the Weyl sequence (2**64 / golden ratio): consecutive batches get far-apart seeds.
_WEYL = 0x9E3779B97F4A7C15
_SEEDS = 2**64


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


def batch_seed(run_seed: int, batch: int) -> int:
    """The device seed of training batch number ``batch`` (from 1, across a fit's epochs) of a run seeded ``run_seed``.

    ``run_seed + batch * 0x9E3779B97F4A7C15`` modulo 2**64: distinct for the batches of a run, and a
    function of the run's seed and the batch's number only.
    """
    return (run_seed + batch * _WEYL) % _SEEDS


class SeedsDeviceAtSetup:
    """Mixin for Trainer strategies: seed the device when the run's environment is set up, and at every training batch.

    Lightning's DDP re-seeds every rank from ``PL_GLOBAL_SEED`` at the same point, once per
    ``fit``/``validate``/``test``/``predict``. The run's seed (:attr:`run_seed`, ``torch.initial_seed()``
    then) also seeds each training batch (:func:`batch_seed`, in Lightning's ``on_train_batch_start``
    strategy hook, right before ``training_step``); a resumed run takes the seed of the run it
    continues (:mod:`trainer_plugins.long_runs._loader_position` keeps it in the checkpoint).
    """

    root_device: Any
    lightning_module: Any
    #: The run's seed, from which every training batch's device seed is made.
    run_seed: int = 0

    def setup_environment(self) -> None:
        super().setup_environment()  # type: ignore[misc]
        self.run_seed = seed_device(self.root_device)

    def on_train_start(self) -> None:
        import torch_xla.core.xla_model as xm

        super().on_train_start()  # type: ignore[misc]
        # kept for the per-batch hook, which is on every step's path: no property or import there
        self._batch_count = self.lightning_module.trainer.fit_loop.epoch_loop.batch_progress.total
        self._set_device_seed = xm.set_rng_state
        self._device_name = str(self.root_device)

    def on_train_batch_start(self, batch: Any, batch_idx: int, *args: Any) -> None:
        """Seed the device for this batch: :func:`batch_seed` of :attr:`run_seed` and the fit's batch count."""
        super().on_train_batch_start(batch, batch_idx, *args)  # type: ignore[misc]
        # batch_seed(self.run_seed, ready), written out: one Python call less on every step
        self._set_device_seed((self.run_seed + self._batch_count.ready * _WEYL) % _SEEDS, self._device_name)


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
