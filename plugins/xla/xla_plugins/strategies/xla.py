"""The multi-device XLA strategy: one worker per device, launched through torch_xla's multiprocessing."""

from __future__ import annotations

from typing import Any, ClassVar, Optional, Union

import torch
from lightning.fabric.strategies.xla import XLAStrategy as _LightningFabricXLAStrategy
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.strategies.xla import XLAStrategy as _LightningXLAStrategy
from torch import Tensor

from trainer_plugins.long_runs._interrupted_validation import CorrectsRestarts
from trainer_plugins.long_runs._loader_position import ResumesLoaderPosition
from xla_plugins.checkpoints._background_checkpoints import (
    FabricWritesCheckpointsInBackground,
    WritesCheckpointsInBackground,
)
from xla_plugins.compilation._compile_budget import HasCompileBudget, MonitorsFabricSteps
from xla_plugins.long_runs._fabric_preemption import FabricStopsOnSignal
from xla_plugins.long_runs._goodput import KeepsGoodputLedger
from xla_plugins.long_runs._preemption import SavesCheckpointOnStop
from xla_plugins.roles.environment import XLAEnvironment, check_launcher_world, process_environment
from xla_plugins.runtime import _probes, _world
from xla_plugins.strategies import _reduce
from xla_plugins.strategies._batch_norm import CorrectsBatchNormAtSetup, CorrectsBatchNormWithModule
from xla_plugins.strategies._evaluation import RunsPendingEvaluationWork
from xla_plugins.strategies._seed import SeedsDeviceAtSetup, SeedsDeviceWithModule
from xla_plugins.strategies._tied_parameters import MovesModelKeepingTies, MovesModuleKeepingTies
from xla_plugins.strategies.launchers import FabricXLALauncher, ReportsProgress, XLALauncher, progress


class _OneWorkerPerDevice(ReportsProgress):
    """What both flavours change in Lightning's XLA strategy: environment, device, launcher, reductions, checkpoints.

    Constructor arguments are those of Lightning's ``XLAStrategy`` of the flavour. Each flavour
    names its launcher (:attr:`_launcher_class`) and the Lightning strategy it subclasses
    (:attr:`_lightning_strategy`), and exposes :meth:`_all_reduce` under its Lightning name.
    """

    _launched: bool
    _launcher_class: ClassVar[type]
    _lightning_strategy: ClassVar[type]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _probes.require_torch_xla()
        super().__init__(*args, **kwargs)
        self.cluster_environment = process_environment()

    def _configure_launcher(self) -> None:
        """The flavour's launcher; none where torchrun started the processes (one per device, as they are)."""
        external = self.cluster_environment.creates_processes_externally  # type: ignore[attr-defined]
        self._launcher = None if external else self._launcher_class(self)

    def setup_environment(self) -> None:
        """Join torchrun's world first where torchrun started the processes, then Lightning's set-up."""
        if self.cluster_environment.creates_processes_externally:  # type: ignore[attr-defined]
            self._join_launcher_world()
        super().setup_environment()  # type: ignore[misc]

    def _join_launcher_world(self) -> None:
        """Under torchrun: join torch_xla's world before the device is touched, and check it is torchrun's.

        torch_xla's torchrun support: ``dist.init_process_group("xla", init_method="xla://")``,
        whose rendezvous calls ``pjrt.initialize_multiprocess(LOCAL_RANK, LOCAL_WORLD_SIZE)`` (on TPU:
        one chip per process) when torchrun started the process. A process group that exists
        already is reused. Then :func:`~xla_plugins.roles.environment.check_launcher_world` holds torchrun's
        ``WORLD_SIZE``/``RANK`` against the runtime's world of one replica per device.

        Raises:
            RuntimeError: see :func:`~xla_plugins.roles.environment.check_launcher_world`.
        """
        import torch.distributed as dist
        import torch_xla.distributed.xla_backend  # noqa: F401  registers the "xla" backend and xla://

        if not dist.is_initialized():
            dist.init_process_group("xla", init_method="xla://")
        check_launcher_world(_world.one_replica_per_device, "device")

    @property
    def root_device(self) -> torch.device:
        """This worker's XLA device (``torch_xla.device()``).

        Raises:
            RuntimeError: read before the workers are launched; each worker has its own device.
        """
        if not self._launched:
            raise RuntimeError(
                "The multi-device XLA strategy has no root device before its workers are launched: each worker"
                " gets its own. Read `strategy.parallel_devices` for the devices it will use."
            )
        import torch_xla

        return torch_xla.device()

    @property
    def num_nodes(self) -> int:
        """Hosts of the slice, from the runtime once the workers run (the world model's ``num_nodes``);
        before, and under torchrun, Lightning's ``num_nodes`` flag (the runtime decides: the flag is not
        needed without torchrun)."""
        if self._launched and isinstance(self.cluster_environment, XLAEnvironment):
            return self.cluster_environment.world().num_nodes
        return self._num_nodes  # type: ignore[attr-defined, no-any-return]

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    def _all_reduce(
        self,
        output: Union[Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Tensor:
        """Reduce ``output`` over all replicas: sum, mean/avg, max or min (``group`` is ignored, as in Lightning's).

        See :func:`~xla_plugins.strategies._reduce.all_reduce`.

        Raises:
            ValueError: another ``reduce_op``.
        """
        progress()
        world_size: int = self.world_size  # type: ignore[attr-defined]
        return _reduce.all_reduce(output, reduce_op, world_size, self.root_device)

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Sync pending lazy tensors on every rank (so no collective hangs), then write on global rank 0.

        Takes the arguments of the flavour's ``save_checkpoint`` in Lightning.
        """
        import torch_xla

        torch_xla.sync()
        # Lightning's XLAStrategy.save_checkpoint would sync with the deprecated `xm.mark_step`.
        super(self._lightning_strategy, self).save_checkpoint(*args, **kwargs)  # type: ignore[arg-type, misc]


class XLAStrategy(  # type: ignore[misc]
    KeepsGoodputLedger,
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    HasCompileBudget,
    WritesCheckpointsInBackground,
    RunsPendingEvaluationWork,
    CorrectsBatchNormAtSetup,
    _OneWorkerPerDevice,
    SeedsDeviceAtSetup,
    MovesModelKeepingTies,
    _LightningXLAStrategy,
):
    """Strategy of ``lightning.Trainer`` for all devices of an XLA host (registered as ``"xla"``).

    A ``DDPStrategy``-style parallel strategy, as Lightning's ``XLAStrategy`` which it subclasses:
    :class:`~xla_plugins.strategies.launchers.XLALauncher` starts one worker per device; dataloaders
    are wrapped once in torch_xla's ``MpDeviceLoader`` (still exposing ``dataset`` and
    ``batch_sampler``); rank 0's parameters are broadcast at setup; ``all_gather``, ``broadcast``,
    ``reduce`` and ``barrier`` use XLA collectives (``barrier`` and ``broadcast`` do nothing before
    the workers start; ``reduce`` supports sum, mean/avg, max and min, as DDP does, where
    Lightning's supports sum and mean only); gradients are reduced inside the optimizer step (``xm.reduce_gradients``);
    ``distributed_sampler_kwargs`` is ``{"num_replicas": world_size, "rank": global_rank}``.

    Differences from Lightning's: world size and ranks come from this plugin's
    :class:`~xla_plugins.roles.environment.XLAEnvironment`, the device from ``torch_xla.device()``, pending
    graphs are synced with ``torch_xla.sync()`` before a checkpoint is written (by global rank 0
    only, with CPU tensors), pending evaluation work runs when validation ends, worker failures stop
    the run, ``reduce`` has max and min, and each replica's device RNG is seeded from torch's seed at
    setup (every rank the same seed, as Lightning seeds DDP ranks; see
    :func:`~xla_plugins.strategies._seed.seed_device`). It has no ``is_distributed`` of its own:
    the connector whitelists it.

    Before launch, ``world_size`` reads 1 and the ranks read 0 (placeholders); ``root_device``
    raises ``RuntimeError``, since each worker has its own.

    Args:
        accelerator, parallel_devices, checkpoint_io, precision_plugin: as Lightning's ``XLAStrategy``.
        debug: set ``PT_XLA_DEBUG=1`` in the workers.
        sync_module_states: broadcast rank 0's parameters and buffers at setup.
        recompiles: the compile monitor's budget (keyword; see
            :class:`~xla_plugins.compilation._compile_budget.HasCompileBudget`).

    Raises:
        ValueError: ``recompiles`` is not ``"warn"``, ``"error"``, ``"off"`` or ``None``.
        ModuleNotFoundError: torch_xla is not installed.
    """

    _launcher_class = XLALauncher
    _lightning_strategy = _LightningXLAStrategy
    reduce = _OneWorkerPerDevice._all_reduce  # Lightning's Trainer name of the reduction


class FabricXLAStrategy(  # type: ignore[misc]
    MonitorsFabricSteps,
    FabricStopsOnSignal,
    FabricWritesCheckpointsInBackground,
    CorrectsBatchNormWithModule,
    _OneWorkerPerDevice,
    SeedsDeviceWithModule,
    MovesModuleKeepingTies,
    _LightningFabricXLAStrategy,
):
    """Strategy of ``lightning.Fabric`` for all devices of an XLA host (registered as ``"xla"``).

    Fabric's counterpart of :class:`XLAStrategy`, with the same changes to Lightning's: this
    plugin's environment, ``torch_xla.device()``, ``torch_xla.sync()`` before checkpoints and the
    failure-stopping :class:`~xla_plugins.strategies.launchers.FabricXLALauncher`, ``all_reduce`` with
    max and min, the device RNG seeded when a module is set up, and ``fabric.save`` written
    atomically in the background by global rank 0
    (:class:`~xla_plugins.checkpoints._background_checkpoints.FabricWritesCheckpointsInBackground`).
    ``fabric.setup_optimizers`` after ``fabric.setup_module`` is refused with Lightning's
    ``RuntimeError`` (set the model and optimizers up together with ``fabric.setup``). Its precision
    plugin steps with ``xm.optimizer_step(..., barrier=True)``, which reduces the gradients. The
    loop's steps are watched for late compilations and host reads (:mod:`xla_plugins.compilation.fabric_steps`;
    ``recompiles``, keyword, is the budget, see
    :class:`~xla_plugins.compilation._compile_budget.MonitorsFabricSteps`).

    Raises:
        ValueError: ``recompiles`` is not a budget.
        ModuleNotFoundError: torch_xla is not installed.
    """

    _launcher_class = FabricXLALauncher
    _lightning_strategy = _LightningFabricXLAStrategy
    all_reduce = _OneWorkerPerDevice._all_reduce  # Lightning's Fabric name of the reduction
