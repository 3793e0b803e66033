"""One ``"tpu"`` device, one process: Lightning's ``SingleDeviceStrategy`` (Trainer and Fabric) on TorchTPU."""

from __future__ import annotations

from lightning.fabric.strategies import SingleDeviceStrategy as FabricSingleDeviceStrategy
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch.nn import Module
from typing_extensions import override

from torchtpu_plugins.strategies._on_tpu import CPUCheckpoints, move_keeping_parameters
from trainer_plugins.long_runs._background_checkpoints import WritesCheckpointsInBackground
from trainer_plugins.long_runs._interrupted_validation import CorrectsRestarts
from trainer_plugins.long_runs._loader_position import ResumesLoaderPosition
from trainer_plugins.long_runs._preemption import SavesCheckpointOnStop


class TorchTPUSingleDeviceStrategy(  # type: ignore[misc]
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    WritesCheckpointsInBackground,
    CPUCheckpoints,
    SingleDeviceStrategy,
):
    """Lightning's ``SingleDeviceStrategy`` on one ``"tpu"`` device; checkpoints hold CPU tensors; long runs."""


class FabricTorchTPUSingleDeviceStrategy(FabricSingleDeviceStrategy):
    """Fabric's ``SingleDeviceStrategy`` on one ``"tpu"`` device; moving a module keeps its parameter objects."""

    @override
    def module_to_device(self, module: Module) -> None:
        move_keeping_parameters(module, self.root_device)
