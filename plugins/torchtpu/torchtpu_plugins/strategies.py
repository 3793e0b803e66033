"""Lightning's strategies on the ``"tpu"`` device: single device, and DDP over ``"tpu_dist"`` without device ids.

Every strategy here writes CPU tensors into Trainer checkpoints: a tensor saved from ``"tpu"`` keeps
that device, a machine without torch_tpu cannot load it, and Lightning's default ``map_location``
does not remap ``"tpu"``. The copy is made on every rank before rank 0 writes (a host read on some
ranks only can stall a TorchTPU mesh; not verified on TPU).

DDP runs one process per chip, as TorchTPU does. Only what the ``"tpu"`` device changes is replaced:

* the root device is the one this process is bound to, ``torch.accelerator.current_device_index()``
  (TorchTPU binds each process to one index; sources disagree on which, so it is read, never derived
  from ``LOCAL_RANK``);
* DDP gets no ``device_ids``: Lightning 2.6 passes ``[index]`` for every non-CPU device and then opens
  ``torch.cuda.Stream()`` around the wrapping, which fails without CUDA; TorchTPU's DDP runs without them;
* the process group is initialised without ``device_id``: Lightning 2.6 passes the root device, and
  torch then asks the group for a backend bound to that device, which a ``"tpu_dist"`` group written
  in Python (the stand-in's) does not have. TorchTPU's own examples initialise ``"tpu_dist"`` without it.

The process-group backend is Lightning's rule unchanged: ``torch.distributed``'s device-to-backend map,
where TorchTPU (and the stand-in) map ``"tpu"`` to ``"tpu_dist"``.

The Trainer strategies run long runs with the core's mixins (:mod:`trainer_plugins.long_runs`): a stop
signal writes a checkpoint that ``ckpt_path="last"`` resumes exactly, DDP's processes agreeing on the
stop over the ``"tpu_dist"`` group; checkpoints are written atomically, in a background thread.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from lightning.fabric.strategies import DDPStrategy as FabricDDPStrategy
from lightning.fabric.strategies import SingleDeviceStrategy as FabricSingleDeviceStrategy
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.seed import reset_seed
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch.nn import Module
from typing_extensions import override

from trainer_plugins.long_runs._background_checkpoints import WritesCheckpointsInBackground
from trainer_plugins.long_runs._interrupted_validation import CorrectsRestarts
from trainer_plugins.long_runs._loader_position import ResumesLoaderPosition
from trainer_plugins.long_runs._preemption import SavesCheckpointOnStop


def _bound_device() -> torch.device:
    """The ``"tpu"`` device this process is bound to (``torch.accelerator``, never ``LOCAL_RANK``)."""
    return torch.device("tpu", torch.accelerator.current_device_index())


def _init_process_group(strategy: DDPStrategy | FabricDDPStrategy) -> None:
    """Lightning's process-group start for ``strategy``, with its backend and timeout and no ``device_id``."""
    assert strategy.cluster_environment is not None
    strategy._process_group_backend = strategy._get_process_group_backend()
    _init_dist_connection(strategy.cluster_environment, strategy._process_group_backend, timeout=strategy._timeout)


def _move_keeping_parameters(module: Module, device: torch.device) -> None:
    """Move ``module`` to ``device`` keeping its ``Parameter`` objects (torch's swap-on-conversion mode).

    A CPU tensor cannot take ``"tpu"`` data in place, so ``Module.to`` would build new parameters and
    an optimizer made before ``fabric.setup(model, optimizer)`` would keep stepping the CPU ones (the
    model would not train, silently; Lightning re-points the optimizer for its XLA strategy only).
    ``torch.utils.swap_tensors`` swaps each parameter's contents instead.
    """
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.to(device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)


def _on_cpu(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with every tensor copied to the CPU (Lightning's ``move_data_to_device``)."""
    return move_data_to_device(checkpoint, torch.device("cpu"))


class _CPUCheckpoints:
    """Trainer strategies on ``"tpu"``: the checkpoint is copied to the CPU (on every rank) before it is written."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None
    ) -> None:
        super().save_checkpoint(_on_cpu(checkpoint), filepath, storage_options)  # type: ignore[misc]


class TorchTPUSingleDeviceStrategy(  # type: ignore[misc]
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    WritesCheckpointsInBackground,
    _CPUCheckpoints,
    SingleDeviceStrategy,
):
    """Lightning's ``SingleDeviceStrategy`` on one ``"tpu"`` device; checkpoints hold CPU tensors; long runs."""


class FabricTorchTPUSingleDeviceStrategy(FabricSingleDeviceStrategy):
    """Fabric's ``SingleDeviceStrategy`` on one ``"tpu"`` device; moving a module keeps its parameter objects."""

    @override
    def module_to_device(self, module: Module) -> None:
        _move_keeping_parameters(module, self.root_device)


class TorchTPUDDPStrategy(  # type: ignore[misc]
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    WritesCheckpointsInBackground,
    _CPUCheckpoints,
    DDPStrategy,
):
    """Lightning's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``.

    Checkpoints hold CPU tensors, copied on every rank; long runs (the core's mixins).
    """

    @property
    @override
    def root_device(self) -> torch.device:
        return _bound_device()

    @override
    def determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None

    @override
    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        _init_process_group(self)


class FabricTorchTPUDDPStrategy(FabricDDPStrategy):
    """Fabric's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``."""

    @property
    @override
    def root_device(self) -> torch.device:
        return _bound_device()

    @override
    def _determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None

    @override
    def module_to_device(self, module: Module) -> None:
        _move_keeping_parameters(module, self.root_device)

    @override
    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        _init_process_group(self)
