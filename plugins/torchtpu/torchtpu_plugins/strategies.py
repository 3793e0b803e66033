"""DDP on the ``"tpu"`` device: Lightning's ``DDPStrategy`` over ``"tpu_dist"``, without device ids.

One process per chip, as TorchTPU runs DDP. Only what the ``"tpu"`` device changes is replaced:

* the root device is the one this process is bound to, ``torch.accelerator.current_device_index()``
  (TorchTPU binds each process to one index; sources disagree on which, so it is read, never derived
  from ``LOCAL_RANK``);
* DDP gets no ``device_ids``: Lightning 2.6 passes ``[index]`` for every non-CPU device and then opens
  ``torch.cuda.Stream()`` around the wrapping, which fails without CUDA; TorchTPU's DDP runs without them.

The process-group backend is Lightning's rule unchanged: ``torch.distributed``'s device-to-backend map,
where TorchTPU (and the stand-in) map ``"tpu"`` to ``"tpu_dist"``.
"""

from __future__ import annotations

from typing import Optional

import torch
from lightning.fabric.strategies import DDPStrategy as FabricDDPStrategy
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override


def _bound_device() -> torch.device:
    """The ``"tpu"`` device this process is bound to (``torch.accelerator``, never ``LOCAL_RANK``)."""
    return torch.device("tpu", torch.accelerator.current_device_index())


class TorchTPUDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``."""

    @property
    @override
    def root_device(self) -> torch.device:
        return _bound_device()

    @override
    def determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None


class FabricTorchTPUDDPStrategy(FabricDDPStrategy):
    """Fabric's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``."""

    @property
    @override
    def root_device(self) -> torch.device:
        return _bound_device()

    @override
    def _determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None
