"""Local SGD: replicas train independently and average their parameters every few steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Optional, Union

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.utilities.distributed import (
    _all_gather_ddp_if_available,
    _distributed_is_initialized,
    _init_dist_connection,
    _sync_ddp_if_available,
)
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import Tensor


class LocalSGDStrategy(ParallelStrategy):
    """Local SGD on CPU processes (registered as ``"local_sgd"``).

    One process per device (``Trainer(devices=N)``), forked by Lightning's multiprocessing launcher
    and joined by a gloo process group. Replicas start from rank 0's parameters, train on their own
    shard of the data (the Trainer injects a ``DistributedSampler`` because ``is_distributed`` is
    ``True``), and average parameters every ``sync_every`` optimizer steps and at the end of fit.

    Args:
        sync_every: optimizer steps between two parameter averages (>= 1).
        start_method: ``"fork"`` (default) or ``"spawn"``, as Lightning's ``ddp_fork``/``ddp_spawn``.

    Raises:
        ValueError: ``sync_every`` is below 1.
    """

    def __init__(
        self,
        sync_every: int = 4,
        start_method: Literal["spawn", "fork", "forkserver"] = "fork",
        accelerator: Optional[pl.accelerators.Accelerator] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[Any] = None,
        checkpoint_io: Optional[Any] = None,
        precision_plugin: Optional[Any] = None,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be at least 1, got {sync_every}")
        super().__init__(accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin)
        self.sync_every = sync_every
        self._start_method = start_method
        self._num_nodes = 1
        self._optimizer_steps = 0

    @property
    def is_distributed(self) -> bool:
        """``True`` when more than one process trains: each then needs its own shard of the data."""
        return self.num_processes * self.num_nodes > 1

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}

    def _configure_launcher(self) -> None:
        self._launcher = _MultiProcessingLauncher(self, start_method=self._start_method)

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    def setup_environment(self) -> None:
        super().setup_environment()
        self.set_world_ranks()
        assert self.cluster_environment is not None
        _init_dist_connection(self.cluster_environment, "gloo")

    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.average_parameters(broadcast_from=0)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            _optimizers_to_device(self.optimizers, self.root_device)
        self.setup_precision_plugin()

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """Step this replica's optimizer; every ``sync_every`` steps, average the replicas."""
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._optimizer_steps += 1
        if self._optimizer_steps % self.sync_every == 0:
            self.average_parameters()
        return output

    def on_train_end(self) -> None:
        self.average_parameters()

    @torch.no_grad()
    def average_parameters(self, broadcast_from: Optional[int] = None) -> None:
        """Average the parameters over all processes, or copy rank ``broadcast_from``'s when given."""
        if not _distributed_is_initialized() or self.model is None:
            return
        for parameter in self.model.parameters():
            if broadcast_from is not None:
                dist.broadcast(parameter.data, src=broadcast_from)
            else:
                dist.all_reduce(parameter.data, op=dist.ReduceOp.SUM)
                parameter.data /= dist.get_world_size()

    def reduce(
        self,
        tensor: Union[Tensor, Any],
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Any:
        return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op) if isinstance(tensor, Tensor) else tensor

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        return _all_gather_ddp_if_available(tensor, group=group, sync_grads=sync_grads)

    def barrier(self, name: Optional[str] = None, *args: Any, **kwargs: Any) -> None:
        if _distributed_is_initialized():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not _distributed_is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]
