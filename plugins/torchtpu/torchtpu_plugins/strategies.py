"""Lightning's strategies on the ``"tpu"`` device: single device, DDP over ``"tpu_dist"`` without device ids, FSDP2.

Every strategy here writes CPU tensors into Trainer checkpoints: a tensor saved from ``"tpu"`` keeps
that device, a machine without torch_tpu cannot load it, and Lightning's default ``map_location``
does not remap ``"tpu"``. The copy is made on every rank before rank 0 writes (a host read on some
ranks only can stall a TorchTPU mesh; not verified on TPU).

DDP runs one process per chip, as TorchTPU does. Only what the ``"tpu"`` device changes is replaced:

* the root device is the one this process is bound to, ``torch.accelerator.current_device_index()``
  (TorchTPU binds each process to one index; sources disagree on which, so it is read, never derived
  from ``LOCAL_RANK``);
* DDP gets no ``device_ids``: Lightning 2.6 passes ``[index]`` for every non-CPU device and then opens
  ``torch.cuda.Stream()`` around the wrapping, which fails without CUDA; TorchTPU's DDP runs without them;
* the process group is initialised without ``device_id``: Lightning 2.6 passes the root device, and
  torch then asks the group for a backend bound to that device, which a ``"tpu_dist"`` group written
  in Python (the stand-in's) does not have. TorchTPU's own examples initialise ``"tpu_dist"`` without it.

A default group that a launcher made before the strategy starts (Ray Train's ``TorchTrainer``:
``"gloo"`` on workers without a ``TPU`` resource) has no backend for ``"tpu"``: beside it, DDP and the
strategy's reductions and gathers over the world run on a second group of the same ranks on
``"tpu_dist"`` (:mod:`torchtpu_plugins._process_groups`), destroyed at teardown.

The process-group backend is Lightning's rule unchanged: ``torch.distributed``'s device-to-backend map,
where TorchTPU (and the stand-in) map ``"tpu"`` to ``"tpu_dist"``.

Processes an outside launcher started (torchrun, Ray Train, srun; the cluster environment's
``creates_processes_externally``) are taken as they are: no process is started, the world size and
the ranks are the launcher's, and a process group that already exists (Ray Train initialises one
before the user's function runs) is reused with its own backend, once its world size and this
process's rank agree with the cluster environment's.

Fully sharded training is Lightning's own FSDP2 path, its ``ModelParallelStrategy`` (torch's
``fully_shard`` on a ``DeviceMesh("tpu")``), with the bound device and the process group as for DDP, and
a one-dimensional data-parallel mesh over every process (Lightning's default puts the processes of a
host on its tensor-parallel dimension). A module that shards itself in ``configure_model`` (Trainer)
or a ``parallelize_fn`` (Fabric) keeps its sharding; otherwise :func:`shard_each_child` shards it.

The Trainer strategies run long runs with the core's mixins (:mod:`trainer_plugins.long_runs`): a stop
signal writes a checkpoint that ``ckpt_path="last"`` resumes exactly, DDP's processes agreeing on the
stop over the ``"tpu_dist"`` group; checkpoints are written atomically, in a background thread.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from lightning.fabric.strategies import DDPStrategy as FabricDDPStrategy
from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallelStrategy
from lightning.fabric.strategies import SingleDeviceStrategy as FabricSingleDeviceStrategy
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.seed import reset_seed
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.nn import Module
from typing_extensions import override

from torchtpu_plugins import _process_groups
from trainer_plugins.long_runs._background_checkpoints import WritesCheckpointsInBackground
from trainer_plugins.long_runs._interrupted_validation import CorrectsRestarts
from trainer_plugins.long_runs._loader_position import ResumesLoaderPosition
from trainer_plugins.long_runs._preemption import SavesCheckpointOnStop


def _bound_device() -> torch.device:
    """The ``"tpu"`` device this process is bound to (``torch.accelerator``, never ``LOCAL_RANK``)."""
    return torch.device("tpu", torch.accelerator.current_device_index())


def _init_process_group(
    strategy: DDPStrategy | FabricDDPStrategy | ModelParallelStrategy | FabricModelParallelStrategy,
) -> None:
    """Lightning's process-group start for ``strategy``, with its backend and timeout and no ``device_id``.

    A default process group that exists already is reused, and its backend recorded.

    Raises:
        RuntimeError: the existing group's world size or this process's rank in it differs from the
            cluster environment's (the message names both).
    """
    environment = strategy.cluster_environment
    assert environment is not None
    if torch.distributed.is_initialized():
        group = (torch.distributed.get_world_size(), torch.distributed.get_rank())
        expected = (environment.world_size(), environment.global_rank())
        if group != expected:
            raise RuntimeError(
                f"A process group exists already with world size {group[0]} and this process as rank {group[1]},"
                f" but {type(environment).__name__} gives world size {expected[0]} and rank {expected[1]}."
                " Destroy the group (torch.distributed.destroy_process_group()) or start the processes so"
                " that both agree."
            )
        strategy._process_group_backend = torch.distributed.get_backend()
        return
    strategy._process_group_backend = strategy._get_process_group_backend()
    _init_dist_connection(environment, strategy._process_group_backend, timeout=strategy._timeout)


def _move_keeping_parameters(module: Module, device: torch.device) -> None:
    """Move ``module`` to ``device`` keeping its ``Parameter`` objects (torch's swap-on-conversion mode).

    A CPU tensor cannot take ``"tpu"`` data in place, so ``Module.to`` would build new parameters and
    an optimizer made before ``fabric.setup(model, optimizer)`` would keep stepping the CPU ones (the
    model would not train, silently; Lightning re-points the optimizer for its XLA strategy only).
    ``torch.utils.swap_tensors`` swaps each parameter's contents instead.
    """
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.to(device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)


def _on_cpu(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with every tensor copied to the CPU (Lightning's ``move_data_to_device``)."""
    return move_data_to_device(checkpoint, torch.device("cpu"))


class _TPUGroup:
    """The ``"tpu_dist"`` group a DDP strategy runs over beside a launcher's group without one (else ``None``)."""

    _tpu_group: Optional[Any] = None
    _ddp_kwargs: dict[str, Any]

    def _start_tpu_group(self) -> None:
        """After the process-group start: the ``"tpu_dist"`` group where the default group has no ``"tpu"`` backend.

        DDP gets it as its ``process_group`` (unless one was given). A collective call, made on every rank.
        """
        self._tpu_group = _process_groups.tpu_group()
        if self._tpu_group is not None:
            self._ddp_kwargs.setdefault("process_group", self._tpu_group)

    def _group_for(self, group: Optional[Any]) -> Optional[Any]:
        """The ``"tpu_dist"`` group for the world (``None``, or ``group.WORLD`` as Fabric passes), else ``group``."""
        if self._tpu_group is not None and (group is None or group is dist.group.WORLD):
            return self._tpu_group
        return group

    def all_gather(self, tensor: torch.Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> torch.Tensor:
        """Lightning's ``all_gather``, over the ``"tpu_dist"`` group where the world is asked for."""
        return super().all_gather(tensor, self._group_for(group), sync_grads)  # type: ignore[misc]

    def teardown(self) -> None:
        """Lightning's teardown, then the ``"tpu_dist"`` group destroyed (the launcher's group stays)."""
        super().teardown()  # type: ignore[misc]
        if self._tpu_group is not None and self._ddp_kwargs.get("process_group") is self._tpu_group:
            del self._ddp_kwargs["process_group"]
        _process_groups.destroy(self._tpu_group)
        self._tpu_group = None


class _CPUCheckpoints:
    """Trainer strategies on ``"tpu"``: the checkpoint is copied to the CPU (on every rank) before it is written."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None
    ) -> None:
        super().save_checkpoint(_on_cpu(checkpoint), filepath, storage_options)  # type: ignore[misc]


class TorchTPUSingleDeviceStrategy(  # type: ignore[misc]
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    WritesCheckpointsInBackground,
    _CPUCheckpoints,
    SingleDeviceStrategy,
):
    """Lightning's ``SingleDeviceStrategy`` on one ``"tpu"`` device; checkpoints hold CPU tensors; long runs."""


class FabricTorchTPUSingleDeviceStrategy(FabricSingleDeviceStrategy):
    """Fabric's ``SingleDeviceStrategy`` on one ``"tpu"`` device; moving a module keeps its parameter objects."""

    @override
    def module_to_device(self, module: Module) -> None:
        _move_keeping_parameters(module, self.root_device)


class TorchTPUDDPStrategy(  # type: ignore[misc]
    SavesCheckpointOnStop,
    ResumesLoaderPosition,
    CorrectsRestarts,
    WritesCheckpointsInBackground,
    _TPUGroup,
    _CPUCheckpoints,
    DDPStrategy,
):
    """Lightning's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``.

    Checkpoints hold CPU tensors, copied on every rank; long runs (the core's mixins). A default group
    made by the launcher (Ray Train) is kept, with a ``"tpu_dist"`` group beside it where it has no
    ``"tpu"`` backend.
    """

    @property
    @override
    def root_device(self) -> torch.device:
        return _bound_device()

    @override
    def determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None

    @override
    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        _init_process_group(self)
        self._start_tpu_group()

    @override
    def reduce(
        self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[dist.ReduceOp, str]] = "mean"
    ) -> Any:
        return super().reduce(tensor, self._group_for(group), reduce_op)

    @override
    def _stop_agreement_group(self) -> Optional[Any]:
        """The ``"tpu_dist"`` group beside a launcher's group without a ``"tpu"`` backend (Ray Train's ``"gloo"``)."""
        return self._group_for(None)


class FabricTorchTPUDDPStrategy(_TPUGroup, FabricDDPStrategy):
    """Fabric's ``DDPStrategy`` on TorchTPU: the bound ``"tpu"`` device, no ``device_ids``, ``"tpu_dist"``.

    A default group made by the launcher (Ray Train) is kept, with a ``"tpu_dist"`` group beside it
    where it has no ``"tpu"`` backend.
    """

    @property
    @override
    def root_device(self) -> torch.device:
        return _bound_device()

    @override
    def _determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None

    @override
    def module_to_device(self, module: Module) -> None:
        _move_keeping_parameters(module, self.root_device)

    @override
    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        _init_process_group(self)
        self._start_tpu_group()

    @override
    def all_reduce(
        self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[dist.ReduceOp, str]] = "mean"
    ) -> Any:
        return super().all_reduce(tensor, self._group_for(group), reduce_op)


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
        return _bound_device()

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
            _move_keeping_parameters(module, self.root_device)

    @override
    def _setup_distributed(self) -> None:
        ParallelStrategy.setup_environment(self)
        reset_seed()
        self.set_world_ranks()
        _init_process_group(self)

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
        _move_keeping_parameters(module, self.root_device)
        return super().setup_module(module)

    @override
    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        _init_process_group(self)
