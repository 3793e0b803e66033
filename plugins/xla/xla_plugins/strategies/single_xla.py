"""The single-device XLA strategy: one XLA device, one process, never distributed."""

from __future__ import annotations

from typing import Any, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.fabric.strategies.single_device import SingleDeviceStrategy as _FabricSingleDeviceStrategy
from lightning.fabric.strategies.single_xla import SingleDeviceXLAStrategy as _LightningFabricSingleDeviceXLAStrategy
from lightning.fabric.utilities.rank_zero import rank_zero_deprecation
from lightning.pytorch.strategies.single_device import SingleDeviceStrategy
from lightning.pytorch.strategies.single_xla import SingleDeviceXLAStrategy as _LightningSingleDeviceXLAStrategy

from trainer_plugins.long_runs._interrupted_validation import CorrectsRestarts
from trainer_plugins.long_runs._loader_position import ResumesLoaderPosition
from xla_plugins.checkpoints._background_checkpoints import (
    FabricWritesCheckpointsInBackground,
    WritesCheckpointsInBackground,
)
from xla_plugins.compilation._compile_budget import MonitorsFabricSteps
from xla_plugins.compilation.recompile_budget import check_budget
from xla_plugins.long_runs._fabric_preemption import FabricStopsOnSignal
from xla_plugins.long_runs._goodput import KeepsGoodputLedger
from xla_plugins.long_runs._preemption import SavesCheckpointOnStop
from xla_plugins.runtime import _probes
from xla_plugins.strategies._batch_norm import CorrectsBatchNormAtSetup, CorrectsBatchNormWithModule
from xla_plugins.strategies._evaluation import RunsPendingEvaluationWork
from xla_plugins.strategies._moved_parameters import KeepsOptimizersOnMovedParameters
from xla_plugins.strategies._seed import SeedsDeviceAtSetup, SeedsDeviceWithModule
from xla_plugins.strategies._tied_parameters import MovesModelKeepingTies, MovesModuleKeepingTies

DeviceLike = Union[torch.device, str, int, None]


def xla_device(device: DeviceLike) -> torch.device:
    """The XLA device for ``torch.device("xla", i)``, ``"xla:i"`` or ``i`` (``None``: torch_xla's default).

    Uses ``torch_xla.device(index)``, where Lightning's XLA strategies call the deprecated
    ``xm.xla_device``.

    Raises:
        ModuleNotFoundError: torch_xla is not installed.
    """
    torch_xla = _probes.require_torch_xla()
    index = torch.device(device).index if isinstance(device, (torch.device, str)) else device
    return torch_xla.device(index)


class SingleDeviceXLAStrategy(
    KeepsGoodputLedger,
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    WritesCheckpointsInBackground,
    RunsPendingEvaluationWork,
    CorrectsBatchNormAtSetup,
    SeedsDeviceAtSetup,
    MovesModelKeepingTies,
    _LightningSingleDeviceXLAStrategy,
):
    """Strategy of ``lightning.Trainer`` for one XLA device (registered as ``"single_xla"``).

    Subclasses Lightning's strategy of the same name, so Lightning's XLA code paths apply, but gets
    its device from :func:`xla_device`, runs pending evaluation work when validation ends (see
    :class:`~xla_plugins.strategies._evaluation.RunsPendingEvaluationWork`), seeds the device RNG
    from torch's seed at setup (see :func:`~xla_plugins.strategies._seed.seed_device`) and carries
    no ``is_distributed`` property (Lightning 2.0 removed it; ask the connector instead).

    Args:
        device: the device to run on (see :func:`xla_device`).
        accelerator, checkpoint_io, precision_plugin: as for Lightning's ``SingleDeviceStrategy``.
        debug: set ``PT_XLA_DEBUG=1`` while the strategy is set up (removed at teardown).
        recompiles: the compile monitor's budget, ``"warn"``, ``"error"`` or ``"off"``; ``None``:
            ``XLA_PLUGINS_RECOMPILES`` (default ``"warn"``). See :mod:`xla_plugins.compilation.compile_monitor`.

    Raises:
        ValueError: ``recompiles`` is not one of those (the message names it and the choices).
        ModuleNotFoundError: torch_xla is not installed.
    """

    def __init__(
        self,
        device: DeviceLike = None,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        checkpoint_io: Optional[Any] = None,
        precision_plugin: Optional[Any] = None,
        debug: bool = False,
        recompiles: Optional[str] = None,
    ) -> None:
        self.recompiles = check_budget(recompiles)
        # Lightning's own __init__ would call `xm.xla_device`; its parent's does the rest.
        SingleDeviceStrategy.__init__(
            self,
            device=xla_device(device),
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.debug = debug


class FabricSingleDeviceXLAStrategy(  # type: ignore[misc]
    MonitorsFabricSteps,
    FabricStopsOnSignal,
    FabricWritesCheckpointsInBackground,
    CorrectsBatchNormWithModule,
    SeedsDeviceWithModule,
    KeepsOptimizersOnMovedParameters,
    MovesModuleKeepingTies,
    _LightningFabricSingleDeviceXLAStrategy,
):
    """Strategy of ``lightning.Fabric`` for one XLA device (registered as ``"single_xla"``).

    Fabric's counterpart of :class:`SingleDeviceXLAStrategy`. Unlike Lightning's, it keeps the
    optimizers on the parameters of the moved module, in ``fabric.setup(model, optimizer)`` and in
    ``fabric.setup_optimizers`` after ``fabric.setup_module`` (see
    :class:`~xla_plugins.strategies._moved_parameters.KeepsOptimizersOnMovedParameters`), seeds
    the device RNG when a module is set up, writes ``fabric.save`` checkpoints atomically in the
    background (:class:`~xla_plugins.checkpoints._background_checkpoints.FabricWritesCheckpointsInBackground`),
    and watches the loop's steps for late compilations and host reads (:mod:`xla_plugins.compilation.fabric_steps`).

    Args:
        device, accelerator, checkpoint_io, precision: as Lightning's ``SingleDeviceXLAStrategy``.
        recompiles: the compile monitor's budget (keyword; see
            :class:`~xla_plugins.compilation._compile_budget.MonitorsFabricSteps`).

    Raises:
        ValueError: ``recompiles`` is not ``"warn"``, ``"error"``, ``"off"`` or ``None``.
        ModuleNotFoundError: torch_xla is not installed.
    """

    def __init__(
        self,
        device: DeviceLike = None,
        accelerator: Optional[Any] = None,
        checkpoint_io: Optional[Any] = None,
        precision: Optional[Any] = None,
        *,
        recompiles: Optional[str] = None,
    ) -> None:
        self.recompiles = check_budget(recompiles)
        _FabricSingleDeviceStrategy.__init__(
            self, device=xla_device(device), accelerator=accelerator, checkpoint_io=checkpoint_io, precision=precision
        )


class SingleTPUStrategy(SingleDeviceXLAStrategy):
    """Legacy name of :class:`SingleDeviceXLAStrategy` (``"single_tpu"``); warns that it is deprecated."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        rank_zero_deprecation(
            "`SingleTPUStrategy` ('single_tpu') is deprecated. Use `SingleDeviceXLAStrategy` ('single_xla') instead."
        )
        super().__init__(*args, **kwargs)
