"""The single-device XLA strategy: one XLA device, one process, never distributed."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_deprecation
from lightning.pytorch.strategies.single_device import SingleDeviceStrategy
from lightning.pytorch.strategies.single_xla import SingleDeviceXLAStrategy as _LightningSingleDeviceXLAStrategy

import lightning.pytorch as pl
from xla_plugins import _runtime


class SingleDeviceXLAStrategy(_LightningSingleDeviceXLAStrategy):
    """Strategy of ``lightning.Trainer`` for one XLA device (registered as ``"single_xla"``).

    Subclasses Lightning's strategy of the same name, so Lightning's XLA code paths apply, but gets
    its device from ``torch_xla.device(index)`` (the current API) and carries no ``is_distributed``
    property (Lightning 2.0 removed it; ask the connector instead).

    Args:
        device: the device to run on: ``torch.device("xla", i)``, ``"xla:i"`` or the index ``i``;
            ``None`` means torch_xla's default device.
        accelerator, checkpoint_io, precision_plugin: as for Lightning's ``SingleDeviceStrategy``.
        debug: set ``PT_XLA_DEBUG=1`` while the strategy is set up (removed at teardown).

    Raises:
        ModuleNotFoundError: torch_xla is not installed.
    """

    def __init__(
        self,
        device: Union[torch.device, str, int, None] = None,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        checkpoint_io: Optional[Any] = None,
        precision_plugin: Optional[Any] = None,
        debug: bool = False,
    ) -> None:
        torch_xla = _runtime.require_torch_xla()
        index = torch.device(device).index if isinstance(device, (torch.device, str)) else device
        # Lightning's __init__ would call the deprecated `xm.xla_device`; its parent's does the rest.
        SingleDeviceStrategy.__init__(
            self,
            device=torch_xla.device(index),
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.debug = debug


class SingleTPUStrategy(SingleDeviceXLAStrategy):
    """Legacy name of :class:`SingleDeviceXLAStrategy` (``"single_tpu"``); warns that it is deprecated."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        rank_zero_deprecation("`SingleTPUStrategy` ('single_tpu') is deprecated. Use `SingleDeviceXLAStrategy` ('single_xla') instead.")
        super().__init__(*args, **kwargs)
