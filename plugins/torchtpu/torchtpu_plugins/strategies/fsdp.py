"""Fully sharded training on a ``DeviceMesh("tpu")``: Lightning's ``ModelParallelStrategy`` (FSDP2) on TorchTPU."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallelStrategy
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.nn import Module
from typing_extensions import override

from torchtpu_plugins.strategies._on_tpu import bound_device, init_process_group, move_keeping_parameters


def shard_each_child(module: Module, device_mesh: Any) -> Module:
    """Shard ``module`` with torch's FSDP2: ``fully_shard`` each direct child that holds parameters.

    The mesh is ``device_mesh["data_parallel"]``. Each child is a root of its own: its parameters are
    gathered when its ``forward`` runs (a LightningModule's ``training_step`` calls its children, not
    its own ``forward``). Children already sharded are left as they are.

    Args:
        module: the model (a LightningModule or any ``torch.nn.Module``).
        device_mesh: Lightning's mesh with a ``"data_parallel"`` dimension.

    Returns:
        ``module``, sharded in place (Fabric's ``parallelize_fn`` contract).

    Raises:
        TypeError: ``module`` holds parameters of its own, outside any child: shard it yourself in
            ``configure_model`` (Trainer) or a ``parallelize_fn`` (Fabric).
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise TypeError(
            f"{type(module).__name__} holds parameters outside its child modules ({', '.join(own)}), which"
            " strategy='fsdp' on 'tpu' cannot shard by itself: apply torch.distributed.fsdp.fully_shard in"
            " configure_model() (Trainer) or pass ModelParallelStrategy(parallelize_fn=...) (Fabric)"
        )
    mesh = device_mesh["data_parallel"]
    for child in module.children():
        if not isinstance(child, FSDPModule) and any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    return module


class _OnTPUMesh:
    """Lightning's ``ModelParallelStrategy`` (Trainer or Fabric) on the bound ``"tpu"`` device, and an ``"auto"``
    mesh with every process on the data-parallel dimension (FSDP)."""

    _data_parallel_size: Any
    _tensor_parallel_size: Any
    num_nodes: int
    num_processes: int

    @property
    def root_device(self) -> torch.device:
        return bound_device()

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        if self._tensor_parallel_size == "auto":
            self._tensor_parallel_size = 1
        super().setup_environment()  # type: ignore[misc]


class TorchTPUFSDPStrategy(_OnTPUMesh, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2) on TorchTPU's ``"tpu"`` mesh, data parallel by default.

    A LightningModule without ``configure_model`` is sharded by :func:`shard_each_child`; one with it
    shards itself there (``self.device_mesh["data_parallel"]``). Checkpoints are Lightning's: a
    distributed checkpoint folder by default (not verified on TPU).
    """

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        # on "tpu" before configure_model shards it: fully_shard moves a CPU module with `param.data = ...`,
        # which the stand-in's "tpu" tensors refuse (a different tensor type); a module on "meta" stays there
        # (Lightning materializes it on the device after sharding)
        module = self.lightning_module
        assert module is not None
        if not any(parameter.is_meta for parameter in module.parameters()):
            move_keeping_parameters(module, self.root_device)

    @override
    def _setup_distributed(self) -> None:
        ParallelStrategy.setup_environment(self)
        reset_seed()
        self.set_world_ranks()
        init_process_group(self)

    @override
    def setup(self, trainer: Any) -> None:
        module = self.lightning_module
        if module is not None and not is_overridden("configure_model", module):
            shard_each_child(module, self.device_mesh)
            # Lightning's setup asks for a configure_model that shards; the module is sharded now
            module.configure_model = lambda: None  # type: ignore[method-assign]
        super().setup(trainer)


class FabricTorchTPUFSDPStrategy(_OnTPUMesh, FabricModelParallelStrategy):
    """Fabric's ``ModelParallelStrategy`` (FSDP2) on TorchTPU's ``"tpu"`` mesh, data parallel by default.

    Args:
        parallelize_fn: shards the module on the mesh (Fabric's); default :func:`shard_each_child`.
        **kwargs: the other arguments of Fabric's ``ModelParallelStrategy``.
    """

    def __init__(self, parallelize_fn: Any = shard_each_child, **kwargs: Any) -> None:
        super().__init__(parallelize_fn, **kwargs)

    @override
    def setup_module(self, module: Module) -> Module:
        """Move ``module`` to ``"tpu"`` (keeping its parameter objects), then Fabric's sharding and setup."""
        move_keeping_parameters(module, self.root_device)
        return super().setup_module(module)

    @override
    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        init_process_group(self)
