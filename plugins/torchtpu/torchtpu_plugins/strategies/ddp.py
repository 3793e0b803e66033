"""DDP over ``"tpu_dist"``, one process per chip, without device ids: Lightning's ``DDPStrategy`` on TorchTPU.

Also ``ddp_spawn`` (the same classes with ``start_method="spawn"``); under torchrun, srun or Ray Train
the processes are the launcher's.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from lightning.fabric.strategies import DDPStrategy as FabricDDPStrategy
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy
from torch.nn import Module
from typing_extensions import override

from torchtpu_plugins.strategies._on_tpu import (
    CPUCheckpoints,
    TPUGroup,
    bound_device,
    init_process_group,
    move_keeping_parameters,
)
from trainer_plugins.long_runs._background_checkpoints import WritesCheckpointsInBackground
from trainer_plugins.long_runs._interrupted_validation import CorrectsRestarts
from trainer_plugins.long_runs._loader_position import ResumesLoaderPosition
from trainer_plugins.long_runs._preemption import SavesCheckpointOnStop


class TorchTPUDDPStrategy(  # type: ignore[misc]
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    WritesCheckpointsInBackground,
    TPUGroup,
    CPUCheckpoints,
    DDPStrategy,
):
    """Lightning's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``.

    Checkpoints hold CPU tensors, copied on every rank; long runs (the core's mixins). A default group
    made by the launcher (Ray Train) is kept, with a ``"tpu_dist"`` group beside it where it has no
    ``"tpu"`` backend.
    """

    @property
    @override
    def root_device(self) -> torch.device:
        return bound_device()

    @override
    def determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None

    @override
    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        init_process_group(self)
        self._start_tpu_group()

    @override
    def reduce(
        self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[dist.ReduceOp, str]] = "mean"
    ) -> Any:
        return super().reduce(tensor, self._group_for(group), reduce_op)

    @override
    def _stop_agreement_group(self) -> Optional[Any]:
        """The ``"tpu_dist"`` group beside a launcher's group without a ``"tpu"`` backend (Ray Train's ``"gloo"``)."""
        return self._group_for(None)


class FabricTorchTPUDDPStrategy(TPUGroup, FabricDDPStrategy):
    """Fabric's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``.

    A default group made by the launcher (Ray Train) is kept, with a ``"tpu_dist"`` group beside it
    where it has no ``"tpu"`` backend.
    """

    @property
    @override
    def root_device(self) -> torch.device:
        return bound_device()

    @override
    def _determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None

    @override
    def module_to_device(self, module: Module) -> None:
        move_keeping_parameters(module, self.root_device)

    @override
    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        init_process_group(self)
        self._start_tpu_group()

    @override
    def all_reduce(
        self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[dist.ReduceOp, str]] = "mean"
    ) -> Any:
        return super().all_reduce(tensor, self._group_for(group), reduce_op)
