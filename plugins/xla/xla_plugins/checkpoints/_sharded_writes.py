"""The files of a sharded checkpoint, from each device's shards copied to the host.

The copy (:func:`~xla_plugins.checkpoints._state_copies.sharded_host_copy`) runs on the training thread;
:func:`write_directory` may run on any thread: ``torch.distributed.checkpoint.save`` with
torch_xla's ``SPMDSavePlanner`` writes those shards, and everything else of the checkpoint goes
to :data:`METADATA_FILE` beside them.

``torch.distributed.checkpoint.async_save`` is not used: its default stager copies plain tensors
and knows neither torch_xla's sharded tensors nor its CPU shards, and it runs each save in a
thread of its own, where the checkpoint must share the one writer of
:class:`~xla_plugins.checkpoints.checkpoint_io.BackgroundXLACheckpointIO` (one write in flight) and be
committed after its files (:mod:`trainer_plugins.long_runs._commits`).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem

from trainer_plugins.long_runs import _commits
from xla_plugins.runtime._silenced_warnings import SHARDED_CHECKPOINT, silenced_on_this_thread

#: File of a sharded checkpoint directory holding everything but the tensors of modules and optimizers.
METADATA_FILE = "meta.pt"


def _storage_writer(directory: str) -> Any:
    import torch.distributed.checkpoint as dcp

    if _commits.is_local(directory):
        return dcp.FileSystemWriter(directory)  # fsync-s every file it writes
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # torch_xla's CheckpointManager's writer

    return FsspecWriter(directory)


def storage_reader(directory: str) -> Any:
    """The ``torch.distributed.checkpoint`` reader of ``directory``: ``FileSystemReader`` or ``FsspecReader``."""
    import torch.distributed.checkpoint as dcp

    if _commits.is_local(directory):
        return dcp.FileSystemReader(directory)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(directory)


def write_directory(
    directory: str, shards: Any, metadata: Optional[dict[str, Any]], process_group: Optional[Any] = None
) -> None:
    """Write a sharded checkpoint's files into ``directory``: ``shards`` (on the host) and ``metadata``.

    ``torch.distributed.checkpoint.save`` with torch_xla's ``SPMDSavePlanner``; on several hosts it is
    coordinated over ``process_group`` (every host writes its own shards; ``None``: the default
    group), on one host it runs without a group. ``metadata`` (anything ``torch.save`` takes) goes
    to :data:`METADATA_FILE`; ``None`` on every host but global rank 0.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    fs = get_filesystem(directory)
    fs.makedirs(directory, exist_ok=True)
    distributed = dist.is_available() and dist.is_initialized()
    with silenced_on_this_thread(SHARDED_CHECKPOINT):  # it may run on a writer thread
        dcp.save(
            shards,
            storage_writer=_storage_writer(directory),
            planner=SPMDSavePlanner(),
            process_group=process_group if distributed else None,
            no_dist=not distributed,
        )
        if metadata is None:
            return
        with fs.open(os.path.join(directory, METADATA_FILE), "wb") as stream:
            torch.save(metadata, stream)
            if _commits.is_local(directory):
                stream.flush()
                os.fsync(stream.fileno())
