"""The SPMD data-parallel strategy: one process drives every device of a mesh through GSPMD."""

from __future__ import annotations

from typing import Any, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import XLACheckpointIO
from lightning.fabric.strategies.parallel import ParallelStrategy as _FabricParallelStrategy
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.rank_zero import rank_zero_info
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.strategies.strategy import TBroadcast
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import find_shared_parameters, set_shared_parameters
from lightning_utilities import apply_to_collection
from torch import Tensor
from typing_extensions import override

from xla_plugins import _runtime
from xla_plugins.strategies import _batches
from xla_plugins.strategies._evaluation import RunsPendingEvaluationWork
from xla_plugins.strategies._moved_parameters import KeepsOptimizersOnMovedParameters
from xla_plugins.strategies._reduce import reduce_op_name
from xla_plugins.strategies._seed import SeedsDeviceAtSetup, SeedsDeviceWithModule

#: Name of the mesh axis the batch is sharded over.
DATA_AXIS = "data"


class _OneProcessOverAMesh:
    """What both flavours share: SPMD mode, the mesh, batch meaning and sharding, one-process collectives.

    Constructor arguments are those of Lightning's ``ParallelStrategy`` (keywords), plus ``batch``
    (see :mod:`xla_plugins.strategies._batches`); checkpoints default to ``XLACheckpointIO`` (full
    CPU tensors).
    """

    _mesh: Optional[Any] = None
    #: The strategy's name in start-up log lines.
    _log_name = "xla_spmd"

    def __init__(self, *, batch: str = _batches.PER_DEVICE, checkpoint_io: Optional[Any] = None, **kwargs: Any) -> None:
        _runtime.require_torch_xla()
        self.batch = _batches.check_batch_meaning(batch)
        self._described: set[str] = set()
        super().__init__(checkpoint_io=checkpoint_io if checkpoint_io is not None else XLACheckpointIO(), **kwargs)  # type: ignore[call-arg]

    def setup_environment(self) -> None:
        """Enter SPMD mode and build the data mesh, then start the runtime on the virtual device."""
        self._enter_spmd()
        super().setup_environment()  # type: ignore[misc]

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Run pending graphs, then write full CPU tensors on rank 0 (``XLACheckpointIO``)."""
        import torch_xla

        torch_xla.sync()
        super().save_checkpoint(*args, **kwargs)  # type: ignore[misc]

    @property
    def root_device(self) -> torch.device:
        """The SPMD virtual device, ``xla:0``, standing for every device of the mesh."""
        return torch.device("xla", 0)

    @property
    def world_size(self) -> int:
        return 1

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def distributed_sampler_kwargs(self) -> None:
        """``None``: no sampler is injected; the loader's own order is dealt out to the devices."""
        return None

    @property
    def num_devices(self) -> int:
        """Devices of the mesh (of ``parallel_devices`` before setup)."""
        if self._mesh is not None:
            return int(self._mesh.size())
        return len(getattr(self, "parallel_devices", None) or ()) or 1

    @property
    def mesh(self) -> Any:
        """The ``torch_xla.distributed.spmd.Mesh`` over all devices (``None`` before setup)."""
        return self._mesh

    def _enter_spmd(self) -> None:
        """Enter SPMD mode (``torch_xla.runtime.use_spmd``) and build the mesh over all devices."""
        import torch_xla.runtime as xr

        if not xr.is_spmd():  # SPMD mode is permanent: a second run in this process is already in it
            xr.use_spmd()
        self._mesh = self._build_mesh(xr.global_runtime_device_count())

    def _build_mesh(self, count: int) -> Any:
        """A 1-D mesh over ``count`` devices, axis :data:`DATA_AXIS` (sharded strategies build their own)."""
        import numpy as np
        import torch_xla.distributed.spmd as xs

        return xs.Mesh(np.arange(count), (count,), (DATA_AXIS,))

    @property
    def batch_axes(self) -> Union[str, tuple[str, ...]]:
        """The mesh axis (or axes, major first) a batch's first dimension is sharded over: :data:`DATA_AXIS`."""
        return DATA_AXIS

    def shard_batch(self, batch: Any) -> Any:
        """Move ``batch``'s tensors to the virtual device and shard their first dimension over the mesh.

        Uneven first dimensions are padded by XLA; scalars stay replicated.
        """
        import torch_xla.distributed.spmd as xs

        def shard(tensor: Tensor) -> Tensor:
            tensor = tensor.to(self.root_device)
            if self._mesh is not None and tensor.dim() > 0:
                xs.mark_sharding(tensor, self._mesh, (self.batch_axes,) + (None,) * (tensor.dim() - 1))
            return tensor

        return apply_to_collection(batch, Tensor, shard)

    def global_batches(self, dataloader: Any, transform: Optional[Any] = None) -> _batches.GlobalBatches:
        """``dataloader`` yielding one global batch per step, by the strategy's ``batch`` meaning.

        Logs the per-device and global batch once per distinct description.
        """
        if isinstance(dataloader, _batches.GlobalBatches):
            return dataloader
        line = _batches.describe(dataloader, self.batch, self.num_devices)
        if line not in self._described:
            self._described.add(line)
            rank_zero_info(f"trainer-plugins: {self._log_name}: {line}")
        per_step = _batches.loader_batches_per_step(self.batch, self.num_devices)
        return _batches.GlobalBatches(dataloader, per_step, transform)

    def _as_global(self, tensor: Any, reduce_op: Optional[Union[ReduceOp, str]]) -> Tensor:
        """A reduction over one process: ``tensor`` itself, already global (computed over the global batch).

        Raises:
            ValueError: ``reduce_op`` is not one Lightning supports (see
                :func:`~xla_plugins.strategies._reduce.reduce_op_name`).
        """
        reduce_op_name(reduce_op)
        return tensor if isinstance(tensor, Tensor) else torch.tensor(tensor, device=self.root_device)

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """Return ``tensor``: in SPMD every tensor is global already."""
        return tensor

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        return obj

    def barrier(self, name: Optional[str] = None, *args: Any, **kwargs: Any) -> None:
        """Nothing to wait for: one process."""


class XLASPMDStrategy(RunsPendingEvaluationWork, _OneProcessOverAMesh, SeedsDeviceAtSetup, ParallelStrategy):  # type: ignore[misc]
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

    Lightning's contract, for one process driving N devices: ``world_size`` is 1 and every rank is
    0; the connector's ``is_distributed`` is ``False`` (one process: no sampler injection, no
    metric syncing, and Lightning's tuners such as the batch-size finder work; the finder scales
    the per-device batch). ``reduce`` (sum, mean/avg, max, min), ``all_gather`` and ``broadcast``
    see global tensors and return them as they are, which are the values one device or DDP give;
    so ``self.log(..., sync_dist=True, reduce_fx=...)`` logs the right value. The device RNG is
    seeded from torch's seed at setup (see :func:`~xla_plugins.strategies._seed.seed_device`).
    Checkpoints hold full CPU tensors. SPMD mode is process-wide and permanent in torch_xla: after
    an SPMD run, later XLA runs in the same process also use the virtual device.

    Args:
        batch: ``"per_device"`` (default) or ``"global"``: what the loader's batch is.
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin: as for
            Lightning's ``ParallelStrategy`` (keywords).

    Raises:
        ValueError: ``batch`` is not ``"per_device"`` or ``"global"``.
        ModuleNotFoundError: torch_xla is not installed.
    """

    strategy_name = "xla_spmd"

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        shared_params = find_shared_parameters(self.model)
        self.model_to_device()
        set_shared_parameters(self.model, shared_params)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)  # parameters stay replicated on every device of the mesh

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """Yield one global batch per step (:meth:`global_batches`); :meth:`batch_to_device` shards it."""
        return self.global_batches(dataloader)

    @override
    def batch_to_device(self, batch: Any, device: Optional[torch.device] = None, dataloader_idx: int = 0) -> Any:
        """Run the module's batch-transfer hooks, then shard the batch over the mesh (:meth:`shard_batch`)."""
        return self.shard_batch(super().batch_to_device(batch, device, dataloader_idx))

    @override
    def reduce(
        self,
        tensor: Union[Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Tensor:
        """Return ``tensor`` (see :meth:`_as_global`)."""
        return self._as_global(tensor, reduce_op)

    @override
    def teardown(self) -> None:
        super().teardown()
        self._mesh = None


class FabricXLASPMDStrategy(  # type: ignore[misc]
    _OneProcessOverAMesh, SeedsDeviceWithModule, KeepsOptimizersOnMovedParameters, _FabricParallelStrategy
):
    """Fabric's counterpart of :class:`XLASPMDStrategy` (``"xla_spmd"``).

    ``fabric.setup_dataloaders`` injects no sampler and returns loaders whose global batches (by
    ``batch``, per device by default, as in :class:`XLASPMDStrategy`) arrive sharded over the mesh;
    ``all_reduce`` (sum, mean/avg, max, min), ``all_gather`` and ``broadcast`` return global tensors
    as they are. Optimizers follow the module's parameters to the device
    (:class:`~xla_plugins.strategies._moved_parameters.KeepsOptimizersOnMovedParameters`), and the
    device RNG is seeded when a module is set up
    (:class:`~xla_plugins.strategies._seed.SeedsDeviceWithModule`).

    Raises:
        ValueError: ``batch`` is not ``"per_device"`` or ``"global"``.
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
    ) -> None:
        _runtime.require_torch_xla()
        super().__init__(
            batch=batch,
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io if checkpoint_io is not None else XLACheckpointIO(),
            precision=precision,
        )

    @override
    def setup_environment(self) -> None:
        self._enter_spmd()
        super().setup_environment()

    @override
    def process_dataloader(self, dataloader: Any) -> Any:
        return self.global_batches(dataloader, transform=self.shard_batch)

    @override
    def all_reduce(
        self,
        tensor: Union[Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Tensor:
        """Return ``tensor`` (see :meth:`_as_global`)."""
        return self._as_global(tensor, reduce_op)
