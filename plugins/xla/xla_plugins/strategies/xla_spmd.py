"""The SPMD data-parallel strategy: one process drives every device of a mesh through GSPMD."""

from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl
import torch
from lightning.fabric.strategies.parallel import ParallelStrategy as _FabricParallelStrategy
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

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
from xla_plugins.strategies import _batches
from xla_plugins.strategies._batch_norm import CorrectsBatchNormAtSetup, CorrectsBatchNormWithModule
from xla_plugins.strategies._evaluation import RunsPendingEvaluationWork
from xla_plugins.strategies._mesh import _OneProcessOverAMesh
from xla_plugins.strategies._moved_parameters import KeepsOptimizersOnMovedParameters
from xla_plugins.strategies._seed import SeedsDeviceAtSetup, SeedsDeviceWithModule
from xla_plugins.strategies._tied_parameters import MovesModelKeepingTies, MovesModuleKeepingTies


class XLASPMDStrategy(  # type: ignore[misc]
    KeepsGoodputLedger,
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    HasCompileBudget,
    WritesCheckpointsInBackground,
    RunsPendingEvaluationWork,
    CorrectsBatchNormAtSetup,
    _OneProcessOverAMesh,
    SeedsDeviceAtSetup,
    MovesModelKeepingTies,
    ParallelStrategy,
):
    """Data parallelism over all XLA devices from one process, with torch_xla's SPMD mode (``"xla_spmd"``).

    ``torch_xla.runtime.use_spmd()`` turns the devices into one virtual device; the strategy builds a
    1-D mesh over all of them (axis ``"data"``), keeps parameters replicated, and shards every batch
    tensor along its first dimension (``xs.mark_sharding``). XLA's GSPMD partitioner then inserts the
    gradient all-reduces. There is one process and no launcher, so nothing is pickled or forked,
    and it runs unpatched on PJRT CPU. It is how torch_xla scales to TPU pods.

    **Batch meaning.** As for every Lightning multi-device strategy, the loader's ``batch_size`` is
    the batch of one device (``batch="per_device"``, the default): each step joins N consecutive
    loader batches into a global batch of ``batch_size x N``, device ``i`` trains on the ``i``-th,
    and an epoch has as many steps as ``"xla"`` gives on the same devices and loader. No sampler is
    injected, so the loader's order is kept (``shuffle=False`` stays in order) and custom samplers
    and batch samplers work unchanged. ``batch="global"`` gives torch_xla's meaning instead: each
    loader batch is the global batch, split N ways. The start-up log states both batches (see
    :mod:`xla_plugins.strategies._batches`).

    Lightning's contract, for one process driving N devices: on one host ``world_size`` is 1 and
    every rank is 0; the connector's ``is_distributed`` is ``False`` (one process: no sampler
    injection, no metric syncing, and Lightning's tuners such as the batch-size finder work; the
    finder scales the per-device batch). On a slice of several hosts (one process each) every
    host is a rank: ``world_size`` is the number of hosts, ``global_rank`` the host's process
    index (:func:`~xla_plugins.runtime._world.one_process_per_host`), ``is_distributed`` is ``True``, a
    ``DistributedSampler`` over the hosts gives each host its share, which goes to the mesh with
    torch_xla's ``minibatch`` input sharding, and host values are reduced across the hosts
    (:class:`~xla_plugins.strategies._hosts.HostGroup`).
    ``reduce`` (sum, mean/avg, max, min), ``all_gather`` and ``broadcast``
    see global tensors and return them as they are, which are the values one device or DDP give;
    so ``self.log(..., sync_dist=True, reduce_fx=...)`` logs the right value. The device RNG is
    seeded from torch's seed at setup (see :func:`~xla_plugins.strategies._seed.seed_device`).
    Checkpoints hold full CPU tensors. SPMD mode is process-wide and permanent in torch_xla: after
    an SPMD run, later XLA runs in the same process also use the virtual device.

    Args:
        batch: ``"per_device"`` (default) or ``"global"``: what the loader's batch is.
        recompiles: the compile monitor's budget (see
            :class:`~xla_plugins.compilation._compile_budget.HasCompileBudget`).
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin: as for
            Lightning's ``ParallelStrategy`` (keywords).

    Raises:
        ValueError: ``batch`` is not ``"per_device"`` or ``"global"``; ``recompiles`` is not
            ``"warn"``, ``"error"``, ``"off"`` or ``None``.
        ModuleNotFoundError: torch_xla is not installed.
    """

    strategy_name = "xla_spmd"

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        """Set the accelerator, the module (:meth:`_place_module`), the optimizers and precision up, as Lightning's."""
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model = self._place_module(self.model)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """Yield one global batch per step (:meth:`global_batches`); :meth:`batch_to_device` shards it.

        The start-up line names the loader by the Trainer's stage (``train_dataloader``,
        ``val_dataloader`` also in the sanity check, ``test_dataloader``, ``predict_dataloader``).
        The training loader is made resumable first (the mixins' ``process_dataloader``, see
        :class:`~trainer_plugins.long_runs._loader_position.ResumesLoaderPosition`), so the global
        batches join batches of the resumable loader.
        """
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        stage = trainer.state.stage if trainer is not None else None
        name = f"{stage.dataloader_prefix}_dataloader" if stage is not None and stage.dataloader_prefix else None
        return self.global_batches(super().process_dataloader(dataloader), name=name)

    @override
    def batch_to_device(self, batch: Any, device: Optional[torch.device] = None, dataloader_idx: int = 0) -> Any:
        """Run the module's batch-transfer hooks, then shard the batch over the mesh (:meth:`shard_batch`).

        On several hosts the hooks run on the CPU (``device`` is the CPU): each host's batch is its
        share, which only the sharded transfer may put on the device.
        """
        if self.hosts.several:
            device = torch.device("cpu")
        return self.shard_batch(super().batch_to_device(batch, device, dataloader_idx))

    reduce = _OneProcessOverAMesh._as_global  # Lightning's Trainer name of the reduction

    @override
    def teardown(self) -> None:
        super().teardown()
        self._mesh = None


class FabricXLASPMDStrategy(  # type: ignore[misc]
    MonitorsFabricSteps,
    FabricStopsOnSignal,
    FabricWritesCheckpointsInBackground,
    CorrectsBatchNormWithModule,
    _OneProcessOverAMesh,
    SeedsDeviceWithModule,
    KeepsOptimizersOnMovedParameters,
    MovesModuleKeepingTies,
    _FabricParallelStrategy,
):
    """Fabric's counterpart of :class:`XLASPMDStrategy` (``"xla_spmd"``).

    ``fabric.setup_dataloaders`` injects no sampler and returns loaders whose global batches (by
    ``batch``, per device by default, as in :class:`XLASPMDStrategy`) arrive sharded over the mesh;
    ``all_reduce`` (sum, mean/avg, max, min), ``all_gather`` and ``broadcast`` return global tensors
    as they are. Optimizers follow the module's parameters to the device
    (:class:`~xla_plugins.strategies._moved_parameters.KeepsOptimizersOnMovedParameters`), and the
    device RNG is seeded when a module is set up
    (:class:`~xla_plugins.strategies._seed.SeedsDeviceWithModule`). The loop's steps are watched for
    late compilations and host reads (:mod:`xla_plugins.compilation.fabric_steps`; ``recompiles``, keyword, is the
    budget, see :class:`~xla_plugins.compilation._compile_budget.MonitorsFabricSteps`). ``fabric.save``
    writes atomically in the background
    (:class:`~xla_plugins.checkpoints._background_checkpoints.FabricWritesCheckpointsInBackground`).

    Raises:
        ValueError: ``batch`` is not ``"per_device"`` or ``"global"``; ``recompiles`` is not a budget.
        ModuleNotFoundError: torch_xla is not installed.
    """

    def __init__(
        self,
        accelerator: Optional[Any] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[Any] = None,
        checkpoint_io: Optional[Any] = None,
        precision: Optional[Any] = None,
        batch: str = _batches.PER_DEVICE,
        *,
        recompiles: Optional[str] = None,
    ) -> None:
        super().__init__(
            recompiles=recompiles,
            batch=batch,
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
        )

    @override
    def setup_environment(self) -> None:
        self._enter_spmd()
        super().setup_environment()

    @override
    def process_dataloader(self, dataloader: Any) -> Any:
        return self.global_batches(dataloader, transform=self.shard_batch)

    all_reduce = _OneProcessOverAMesh._as_global  # Lightning's Fabric name of the reduction
