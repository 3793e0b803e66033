"""Sharded checkpoints of SPMD-sharded modules and optimizers: each device's shards, nothing gathered.

Tensors go through ``torch.distributed.checkpoint`` with torch_xla's SPMD planners
(``torch_xla.experimental.distributed_checkpoint``); the rest of a checkpoint goes to
:data:`METADATA_FILE` beside them. A checkpoint directory appears only whole: it is written under a
temporary name and committed (:meth:`~xla_plugins.checkpoints.checkpoint_io.AtomicXLACheckpointIO.write_sharded`),
by the strategy's checkpoint IO when it has a ``save_sharded`` (in the background with
:class:`~xla_plugins.checkpoints.checkpoint_io.BackgroundXLACheckpointIO`), else here, on the calling thread
(:func:`save_sharded`). Used by the FSDPv2 strategies (:mod:`xla_plugins.strategies.xla_fsdp_v2`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Optional

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer

from xla_plugins.checkpoints._sharded_writes import METADATA_FILE, storage_reader
from xla_plugins.checkpoints.checkpoint_io import AtomicXLACheckpointIO
from xla_plugins.runtime import _torch_xla_contract
from xla_plugins.runtime._silenced_warnings import SHARDED_CHECKPOINT, silenced

__all__ = ["METADATA_FILE", "is_sharded_checkpoint", "load_sharded", "save_sharded", "shard_optimizer_state"]


def shard_optimizer_state(optimizers: Iterable[Optimizer]) -> None:
    """Give each optimizer state tensor shaped like its parameter the parameter's sharding.

    A state loaded from a consolidated checkpoint arrives as full tensors, replicated on every
    device; this puts it back to 1/N per device, as torch_xla's ``prime_optimizer`` shards gradients.
    """
    for optimizer in optimizers:
        for parameter, state in optimizer.state.items():
            sharding = _torch_xla_contract.op_sharding(parameter)
            if not sharding:
                continue
            for value in state.values():
                same = isinstance(value, Tensor) and value.device.type == "xla" and value.shape == parameter.shape
                if same and not _torch_xla_contract.sharding_spec(value):
                    _torch_xla_contract.mark_sharding(value, sharding)


def save_sharded(
    path: _PATH,
    tensors: dict[str, Any],
    metadata: dict[str, Any],
    write_metadata: bool = True,
    staging: Optional[str] = None,
    process_group: Optional[Any] = None,
) -> None:
    """Write a sharded checkpoint on the calling thread: the directory ``path`` holding ``tensors`` and ``metadata``.

    Tensors go through ``torch.distributed.checkpoint`` with torch_xla's ``SPMDSavePlanner`` (each
    device's shards, nothing gathered; on several hosts each writes its own, coordinated by
    ``process_group`` or the default group the SPMD strategies join there); ``metadata`` (anything
    ``torch.save`` takes) goes to :data:`METADATA_FILE` when ``write_metadata`` (on global rank 0
    only), which then commits the directory written under ``staging``
    (:meth:`~xla_plugins.checkpoints.checkpoint_io.AtomicXLACheckpointIO.save_sharded`).
    """
    metadata_or_none = metadata if write_metadata else None
    AtomicXLACheckpointIO().save_sharded(path, tensors, metadata_or_none, staging=staging, process_group=process_group)


def is_sharded_checkpoint(path: _PATH) -> bool:
    """Whether ``path`` (a local path or an fsspec URL) is a directory written by :func:`save_sharded`."""
    fs = get_filesystem(path)
    return bool(fs.isdir(path) and fs.isfile(os.path.join(str(path), METADATA_FILE)))


def load_sharded(path: _PATH, modules: dict[str, Module], optimizers: dict[str, Optimizer]) -> dict[str, Any]:
    """Load a :func:`save_sharded` checkpoint in place into sharded ``modules`` and ``optimizers``; return its metadata.

    Optimizers without state are primed first (torch_xla's ``prime_optimizer``: one step with zero
    gradients), since torch.distributed.checkpoint loads into existing tensors.

    Raises:
        KeyError: a module's or optimizer's key is not in the checkpoint (naming it and those present).
    """
    import torch.distributed.checkpoint as dcp
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, prime_optimizer

    with get_filesystem(path).open(os.path.join(str(path), METADATA_FILE), "rb") as stream:
        metadata = torch.load(stream, map_location="cpu", weights_only=False)
    stored = set(metadata.get("__sharded_keys__", ()))
    missing = [key for key in (*modules, *optimizers) if key not in stored]
    if missing:
        raise KeyError(f"The sharded checkpoint {str(path)!r} has no {missing[0]!r}; it holds {sorted(stored)}.")
    for optimizer in optimizers.values():
        if not optimizer.state:
            prime_optimizer(optimizer)
    target: dict[str, Any] = {key: module.state_dict() for key, module in modules.items()}
    target.update({key: optimizer.state_dict() for key, optimizer in optimizers.items()})
    with silenced(SHARDED_CHECKPOINT):
        dcp.load(
            target,
            storage_reader=storage_reader(str(path)),
            planner=SPMDLoadPlanner(),
            no_dist=not torch.distributed.is_initialized(),
        )
    for key, module in modules.items():
        module.load_state_dict(target[key])
    for key, optimizer in optimizers.items():
        optimizer.load_state_dict(target[key])
    metadata.pop("__sharded_keys__", None)
    return metadata
