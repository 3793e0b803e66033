"""What every strategy on ``"tpu"`` changes in Lightning's: the bound device, the process-group start, CPU checkpoints.

Also the module moves that keep parameter objects (Fabric) and the ``"tpu_dist"`` group a DDP strategy
runs over beside a launcher's group without a ``"tpu"`` backend (:mod:`torchtpu_plugins.strategies._process_groups`).
Why each is needed: :mod:`torchtpu_plugins.strategies`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from lightning.fabric.strategies import DDPStrategy as FabricDDPStrategy
from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallelStrategy
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch.nn import Module

from torchtpu_plugins.strategies import _process_groups


def bound_device() -> torch.device:
    """The ``"tpu"`` device this process is bound to (``torch.accelerator``, never ``LOCAL_RANK``)."""
    return torch.device("tpu", torch.accelerator.current_device_index())


def init_process_group(
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


def move_keeping_parameters(module: Module, device: torch.device) -> None:
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


def on_cpu(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with every tensor copied to the CPU (Lightning's ``move_data_to_device``)."""
    return move_data_to_device(checkpoint, torch.device("cpu"))


class TPUGroup:
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


class CPUCheckpoints:
    """Trainer strategies on ``"tpu"``: the checkpoint is copied to the CPU (on every rank) before it is written."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None
    ) -> None:
        super().save_checkpoint(on_cpu(checkpoint), filepath, storage_options)  # type: ignore[misc]
