"""The SPMD data-parallel strategy: one process drives every device of a mesh through GSPMD."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import XLACheckpointIO
from lightning.fabric.strategies.parallel import ParallelStrategy as _FabricParallelStrategy
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.strategies.strategy import TBroadcast
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import find_shared_parameters, set_shared_parameters
from lightning_utilities import apply_to_collection
from torch import Tensor
from typing_extensions import override

from xla_plugins import _runtime
from xla_plugins.strategies._evaluation import RunsPendingEvaluationWork
from xla_plugins.strategies._moved_parameters import KeepsOptimizersOnMovedParameters

#: Name of the mesh axis the batch is sharded over.
DATA_AXIS = "data"
_REDUCE_OPS = ("sum", "mean", "avg")


class _OneProcessOverAMesh:
    """What both flavours share: SPMD mode, the mesh, batch sharding and one-process collectives.

    Constructor arguments are those of Lightning's ``ParallelStrategy`` (keywords); checkpoints
    default to ``XLACheckpointIO`` (full CPU tensors).
    """

    _mesh: Optional[Any] = None

    def __init__(self, *, checkpoint_io: Optional[Any] = None, **kwargs: Any) -> None:
        _runtime.require_torch_xla()
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
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": 1, "rank": 0}

    @property
    def mesh(self) -> Any:
        """The ``torch_xla.distributed.spmd.Mesh`` over all devices (``None`` before setup)."""
        return self._mesh

    def _enter_spmd(self) -> None:
        """Enter SPMD mode (``torch_xla.runtime.use_spmd``) and build a 1-D mesh over all devices."""
        import numpy as np
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        if not xr.is_spmd():  # SPMD mode is permanent: a second run in this process is already in it
            xr.use_spmd()
        count = xr.global_runtime_device_count()
        self._mesh = xs.Mesh(np.arange(count), (count,), (DATA_AXIS,))

    def shard_batch(self, batch: Any) -> Any:
        """Move ``batch``'s tensors to the virtual device and shard their first dimension over the mesh.

        Uneven first dimensions are padded by XLA; scalars stay replicated.
        """
        import torch_xla.distributed.spmd as xs

        def shard(tensor: Tensor) -> Tensor:
            tensor = tensor.to(self.root_device)
            if self._mesh is not None and tensor.dim() > 0:
                xs.mark_sharding(tensor, self._mesh, (DATA_AXIS,) + (None,) * (tensor.dim() - 1))
            return tensor

        return apply_to_collection(batch, Tensor, shard)

    def _as_global(self, tensor: Any, reduce_op: Optional[Union[ReduceOp, str]]) -> Tensor:
        """A reduction over one process: ``tensor`` itself (already global).

        Raises:
            ValueError: ``reduce_op`` is not sum, mean or avg (the ops of the multi-device strategy).
        """
        op = reduce_op.lower() if isinstance(reduce_op, str) else reduce_op
        if op is not None and op not in (*_REDUCE_OPS, ReduceOp.SUM):
            raise ValueError(f"The SPMD strategy supports reduce_op in {_REDUCE_OPS}, got {reduce_op!r}")
        return tensor if isinstance(tensor, Tensor) else torch.tensor(tensor, device=self.root_device)

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """Return ``tensor``: in SPMD every tensor is global already."""
        return tensor

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        return obj

    def barrier(self, name: Optional[str] = None, *args: Any, **kwargs: Any) -> None:
        """Nothing to wait for: one process."""


class XLASPMDStrategy(RunsPendingEvaluationWork, _OneProcessOverAMesh, ParallelStrategy):  # type: ignore[misc]
    """Data parallelism over all XLA devices from one process, with torch_xla's SPMD mode (``"xla_spmd"``).

    ``torch_xla.runtime.use_spmd()`` turns the devices into one virtual device; the strategy builds a
    1-D mesh over all of them (axis ``"data"``), keeps parameters replicated, and shards every batch
    tensor along its first dimension (``xs.mark_sharding``). XLA's GSPMD partitioner then inserts the
    gradient all-reduces. There is one process and no launcher, so nothing is pickled or forked,
    and it runs unpatched on PJRT CPU. It is how torch_xla scales to TPU pods.

    Lightning's contract, for one process driving N devices: ``world_size`` is 1 and every rank is
    0, so the distributed sampler (``{"num_replicas": 1, "rank": 0}``) gives each sample once per
    epoch and the mesh splits each batch across devices; ``reduce``, ``all_gather`` and
    ``broadcast`` see global tensors and return them as they are (a reduction over one process);
    checkpoints hold full CPU tensors. The connector's ``is_distributed`` is ``True`` (the plugin
    declares the strategy distributed). SPMD mode is process-wide and permanent in torch_xla: after
    an SPMD run, later XLA runs in the same process also use the virtual device.

    Raises:
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


class _ShardedBatches:
    """A dataloader whose batches arrive on the virtual device, sharded over the mesh."""

    def __init__(self, loader: Any, strategy: _OneProcessOverAMesh) -> None:
        self._loader = loader
        self._strategy = strategy
        self.dataset = getattr(loader, "dataset", None)
        self.batch_sampler = getattr(loader, "batch_sampler", None)
        self.sampler = getattr(loader, "sampler", None)

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield self._strategy.shard_batch(batch)

    def __len__(self) -> int:
        return len(self._loader)


class FabricXLASPMDStrategy(_OneProcessOverAMesh, KeepsOptimizersOnMovedParameters, _FabricParallelStrategy):  # type: ignore[misc]
    """Fabric's counterpart of :class:`XLASPMDStrategy` (``"xla_spmd"``).

    ``fabric.setup_dataloaders`` returns loaders whose batches arrive sharded over the mesh;
    ``all_reduce``, ``all_gather`` and ``broadcast`` return global tensors as they are.

    Raises:
        ModuleNotFoundError: torch_xla is not installed.
    """

    def __init__(
        self,
        accelerator: Optional[Any] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[Any] = None,
        checkpoint_io: Optional[Any] = None,
        precision: Optional[Any] = None,
    ) -> None:
        _runtime.require_torch_xla()
        super().__init__(
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
        return _ShardedBatches(dataloader, self)

    @override
    def all_reduce(
        self,
        tensor: Union[Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Tensor:
        """Return ``tensor`` (see :meth:`_as_global`)."""
        return self._as_global(tensor, reduce_op)
