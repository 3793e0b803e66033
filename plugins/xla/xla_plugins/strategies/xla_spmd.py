"""The SPMD data-parallel strategy: one process drives every device of a mesh through GSPMD."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from lightning.fabric.plugins import XLACheckpointIO
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.types import _PATH, ReduceOp
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.strategies.strategy import TBroadcast
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import find_shared_parameters, set_shared_parameters
from lightning_utilities import apply_to_collection
from torch import Tensor
from typing_extensions import override

import lightning.pytorch as pl
from xla_plugins import _runtime

#: Name of the mesh axis the batch is sharded over.
DATA_AXIS = "data"
_REDUCE_OPS = ("sum", "mean", "avg")


class XLASPMDStrategy(ParallelStrategy):
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
    declares the strategy distributed).

    A batch whose first dimension is not divisible by the number of devices is replicated rather
    than sharded (correct, but every device computes all of it): use ``drop_last=True`` or a
    divisible batch size. SPMD mode is process-wide and permanent in torch_xla: after an SPMD run,
    later XLA runs in the same process also use the virtual device.

    Raises:
        ModuleNotFoundError: torch_xla is not installed.
    """

    strategy_name = "xla_spmd"

    def __init__(
        self,
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[Any] = None,
        checkpoint_io: Optional[Any] = None,
        precision_plugin: Optional[Any] = None,
    ) -> None:
        _runtime.require_torch_xla()
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io if checkpoint_io is not None else XLACheckpointIO(),
            precision_plugin=precision_plugin,
        )
        self._mesh: Optional[Any] = None

    # --- one process ------------------------------------------------------------------------------

    @property
    @override
    def root_device(self) -> torch.device:
        """The SPMD virtual device, ``xla:0``, standing for every device of the mesh."""
        return torch.device("xla", 0)

    @property
    @override
    def world_size(self) -> int:
        return 1

    @property
    @override
    def global_rank(self) -> int:
        return 0

    @property
    @override
    def local_rank(self) -> int:
        return 0

    @property
    @override
    def node_rank(self) -> int:
        return 0

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": 1, "rank": 0}

    @property
    def mesh(self) -> Any:
        """The ``torch_xla.distributed.spmd.Mesh`` over all devices (``None`` before setup)."""
        return self._mesh

    # --- setup -----------------------------------------------------------------------------------

    @override
    def setup_environment(self) -> None:
        """Enter SPMD mode and build the data mesh, then start the runtime on the virtual device."""
        import numpy as np
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        count = xr.global_runtime_device_count()
        self._mesh = xs.Mesh(np.arange(count), (count,), (DATA_AXIS,))
        super().setup_environment()

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
        """Move ``batch`` to the virtual device and shard each tensor's first dimension over the mesh."""
        batch = super().batch_to_device(batch, device, dataloader_idx)
        return apply_to_collection(batch, Tensor, self._shard_first_dimension)

    def _shard_first_dimension(self, tensor: Tensor) -> Tensor:
        import torch_xla.distributed.spmd as xs

        if self._mesh is None or tensor.dim() == 0 or tensor.shape[0] % self._mesh.size() != 0:
            return tensor
        xs.mark_sharding(tensor, self._mesh, (DATA_AXIS,) + (None,) * (tensor.dim() - 1))
        return tensor

    # --- collectives over one process --------------------------------------------------------------

    @override
    def reduce(self, tensor: Union[Tensor, Any], group: Optional[Any] = None, reduce_op: Optional[Union[ReduceOp, str]] = "mean") -> Tensor:
        """Return ``tensor``: it is already global, and one process reduces to itself.

        Raises:
            ValueError: ``reduce_op`` is not sum, mean or avg (the ops of the multi-device strategy).
        """
        op = reduce_op.lower() if isinstance(reduce_op, str) else reduce_op
        if op is not None and op not in (*_REDUCE_OPS, ReduceOp.SUM):
            raise ValueError(f"The SPMD strategy supports reduce_op in {_REDUCE_OPS}, got {reduce_op!r}")
        return tensor if isinstance(tensor, Tensor) else torch.tensor(tensor, device=self.root_device)

    @override
    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """Return ``tensor``: in SPMD every tensor is global already."""
        return tensor

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        return obj

    @override
    def barrier(self, name: Optional[str] = None, *args: Any, **kwargs: Any) -> None:
        """Nothing to wait for: one process."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None) -> None:
        """Run pending graphs, then write full CPU tensors (``XLACheckpointIO``)."""
        import torch_xla

        torch_xla.sync()
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def teardown(self) -> None:
        super().teardown()
        self._mesh = None
