"""Checkpoint IO plugins of the XLA strategies: atomic writes, and writes in a background thread.

:class:`AtomicXLACheckpointIO` (the core's atomic writer, :mod:`trainer_plugins.long_runs._checkpoint_io`,
with torch_xla's copy to the CPU and sharded directories) makes a checkpoint visible only once it is
complete, a file or the directory of a sharded checkpoint alike (:mod:`trainer_plugins.long_runs._commits`):
on a local disk written under a temporary name, then renamed; on an fsspec filesystem (an object
store has no atomic rename) moved into place, then marked complete by the commit marker
``<path>.commit`` holding its size in bytes (:func:`is_committed`). :class:`BackgroundXLACheckpointIO`
builds on Lightning's ``AsyncCheckpointIO``: the training thread copies the state to the host and returns, a writer
thread writes it, at most one write is in flight.

The setting :data:`WRITES_VARIABLE` (``background``, the default, ``sync``, ``device-copy`` or
``host-copy``) chooses what the XLA strategies use by default (:func:`default_checkpoint_io`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Optional

from lightning.fabric.plugins.io.xla import XLACheckpointIO
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io.async_plugin import AsyncCheckpointIO

from trainer_plugins.long_runs import _commits
from trainer_plugins.long_runs._checkpoint_io import (  # noqa: F401 - finish_pending_writes is public here too
    AtomicCheckpointIO,
    BackgroundCheckpointIO,
    finish_pending_writes,
    refuse_storage_options,
    remove_stale_temporaries,
)
from trainer_plugins.long_runs._commits import COMMIT_SUFFIX, is_committed  # noqa: F401 - COMMIT_SUFFIX is public here too
from xla_plugins._logging import log
from xla_plugins.checkpoints._sharded_writes import write_directory
from xla_plugins.checkpoints._state_copies import device_copy, device_copy_fits, host_copy, sharded_host_copy
from xla_plugins.runtime import _torch_xla_contract

#: Environment variable choosing how the XLA strategies write checkpoints by default.
WRITES_VARIABLE = "XLA_PLUGINS_CHECKPOINT_WRITES"
#: Valid values of :data:`WRITES_VARIABLE`: a writer thread after a copy on the device where it fits, else
#: to the host (default); on the training thread; a writer thread after a copy on the device, always; or
#: after a copy to the host, always.
WRITES_CHOICES = ("background", "sync", "device-copy", "host-copy")
#: Valid ``copy`` arguments of :class:`BackgroundXLACheckpointIO`.
COPY_CHOICES = ("auto", "host", "device")
#: The ``copy`` of :class:`BackgroundXLACheckpointIO` that each background value of :data:`WRITES_VARIABLE` gives.
_COPY_OF_WRITES = {"background": "auto", "device-copy": "device", "host-copy": "host"}


def checkpoint_writes() -> str:
    """The value of :data:`WRITES_VARIABLE`: ``"background"`` (unset or blank), or one of :data:`WRITES_CHOICES`.

    Raises:
        ValueError: another value; the message names it and the choices.
    """
    text = os.environ.get(WRITES_VARIABLE, "").strip().lower() or WRITES_CHOICES[0]
    if text not in WRITES_CHOICES:
        raise ValueError(
            f"{WRITES_VARIABLE}={os.environ[WRITES_VARIABLE]!r} is not valid: choose one of {list(WRITES_CHOICES)}"
            " ('background': the training step waits only for a copy of the state, on the device where it fits;"
            " 'sync': it waits for the write; 'device-copy': it waits only for a copy on the device, always, which"
            " holds one more copy of the state meanwhile; 'host-copy': it waits for the copy to the host, always)."
        )
    return text


def default_checkpoint_io() -> XLACheckpointIO | AsyncCheckpointIO:
    """The checkpoint IO of an XLA strategy given none: atomic writes, in the background unless the setting is ``sync``.

    See :func:`checkpoint_writes`.

    Raises:
        ValueError: see :func:`checkpoint_writes`.
    """
    writes = checkpoint_writes()
    atomic = AtomicXLACheckpointIO()
    if writes == "sync":
        return atomic
    return BackgroundXLACheckpointIO(atomic, copy=_COPY_OF_WRITES[writes])


class AtomicXLACheckpointIO(AtomicCheckpointIO, XLACheckpointIO):
    """Lightning's ``XLACheckpointIO`` (CPU tensors, ``torch.save``), made atomic: a checkpoint appears only whole.

    Files: the core's :class:`~trainer_plugins.long_runs._checkpoint_io.AtomicCheckpointIO` (its ``write``),
    after torch_xla's copy to the CPU: written to a temporary file ``.<name>.tmp-<host>-<pid>-<id>`` in the target's
    directory; on a local disk flushed, ``fsync``-ed and renamed over the target with
    ``os.replace`` (atomic on POSIX), so a process killed during the write leaves the previous file
    in place; on an fsspec URL moved onto ``path``, then the commit marker ``<path>.commit`` is
    written with the byte size, and a checkpoint counts as complete only with its marker
    (:func:`is_committed`). Sharded checkpoints (:meth:`write_sharded`, the directories of the
    FSDPv2 strategies' ``state_dict_type="sharded"``) the same way, as a directory: written under a
    temporary name, then renamed into place or moved and marked (:mod:`trainer_plugins.long_runs._commits`). The
    temporary names never match Lightning's ``last*.ckpt`` pattern. Each write and each
    ``load_checkpoint`` first removes the temporary files that killed writers of this host left in
    the checkpoint's directory (:func:`~trainer_plugins.long_runs._commits.remove_stale_temporaries`).

    Raises:
        TypeError: ``storage_options`` given (as Lightning's ``XLACheckpointIO``).
        ModuleNotFoundError: torch_xla is not installed.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        refuse_storage_options(self, storage_options)
        self.write(_torch_xla_contract.convert_to_cpu(checkpoint), path)

    def save_sharded(
        self, path: _PATH, tensors: dict[str, Any], metadata: Optional[dict[str, Any]], **options: Any
    ) -> None:
        """Write a sharded checkpoint now: the host copy (:func:`sharded_host_copy`, :func:`host_copy`), then
        :meth:`write_sharded` with ``options``."""
        self.write_sharded(path, sharded_host_copy(tensors), _host_copy_or_none(metadata), **options)

    def write_sharded(
        self,
        path: _PATH,
        shards: Any,
        metadata: Optional[dict[str, Any]],
        staging: Optional[str] = None,
        process_group: Optional[Any] = None,
    ) -> None:
        """Write the sharded checkpoint directory ``path`` atomically: its files under ``staging``, then the commit.

        Args:
            path: the checkpoint directory (local path or fsspec URL).
            shards: state dicts of sharded modules and optimizers on the host (:func:`sharded_host_copy`).
            metadata: the rest of the checkpoint (CPU tensors only), on global rank 0; ``None`` on the other
                hosts, which write their shards and leave the commit to rank 0.
            staging: the temporary directory, the same on every host; default a fresh
                :func:`~trainer_plugins.long_runs._commits.temporary_path` beside ``path``.
            process_group: the group coordinating the hosts' writes (see
                :func:`~xla_plugins.checkpoints._sharded_writes.write_directory`).

        Raises:
            OSError: the filesystem's, when writing or committing fails (the temporary directory is removed).
        """
        path = str(path)
        staging = staging or _commits.temporary_path(path)
        coordinator = metadata is not None
        if coordinator:
            remove_stale_temporaries(os.path.dirname(path))
        try:
            write_directory(staging, shards, metadata, process_group)
            if coordinator:
                _commits.commit(staging, path)
        finally:
            if coordinator:
                _commits.remove(staging)


def _write_host_copy(write: Callable[..., None], held: list[Any], path: _PATH) -> None:
    """On the writer thread: ``write`` the host copy of the :func:`device_copy` in ``held`` to ``path``.

    The device copy is taken out of ``held`` so that it is freed once it is on the host, not only
    after the write: the device (the host's memory, on PJRT CPU) then holds it no longer than needed.
    """
    checkpoint = host_copy(held.pop())
    write(checkpoint, path)


def _host_copy_or_none(metadata: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    return None if metadata is None else host_copy(metadata)


class BackgroundXLACheckpointIO(BackgroundCheckpointIO):
    """The core's background writer (:class:`~trainer_plugins.long_runs._checkpoint_io.BackgroundCheckpointIO`,
    Lightning's ``AsyncCheckpointIO``) for XLA: the step waits only for a copy of the state.

    ``save_checkpoint`` first waits for the write in flight (at most one: the host holds one copy
    of the state), copies the checkpoint, then hands the copy to a writer thread, which calls the
    wrapped plugin's ``write`` (default :class:`AtomicXLACheckpointIO`). With ``copy="host"`` the
    calling thread copies it to the host (:func:`host_copy`: the step waits for the step still
    running on the device, then for the transfer). With ``copy="device"`` it only dispatches a copy
    on the device (:func:`device_copy`, which still waits for a step running on the device) and the
    writer thread makes the host copy, so the step does not wait for the transfer, and the device
    holds a second copy of the state until the writer has transferred it. ``copy="auto"`` (the
    default) takes the device copy where it fits, at each save (:func:`device_copy_fits`: on PJRT
    CPU always, elsewhere by torch_xla's memory figures), else the host copy, and logs the first
    save that falls back to the host. ``save_sharded`` does the same for a sharded checkpoint,
    always copying to the host (:func:`sharded_host_copy`, then the wrapped plugin's
    ``write_sharded``). ``load_checkpoint``, ``remove_checkpoint`` and ``teardown`` wait for the
    write in flight first (so ``trainer.fit`` returns after the last write: Lightning tears the
    strategy's checkpoint IO down at the end of ``fit``); a save after ``teardown`` starts a new
    writer; the interpreter's normal exit waits too (the core's ``_finish_at_exit``). An error of a
    write is raised by the next call that waits.

    Args:
        checkpoint_io: the plugin that writes; it needs a ``write(checkpoint, path)`` method taking
            CPU tensors, and for sharded checkpoints ``write_sharded`` (:class:`AtomicXLACheckpointIO` has
            both). Default: :class:`AtomicXLACheckpointIO`.
        copy: ``"auto"`` (default), ``"host"`` or ``"device"``: where the calling thread copies the state (see above).
            Sharded checkpoints are copied to the host either way (torch_xla reads a device's shards
            only while no program runs, which the training thread goes on dispatching).

    Raises:
        TypeError: ``checkpoint_io`` has no ``write`` method, or ``storage_options`` given to a save.
        ValueError: another ``copy``; the message names it and the choices.
    """

    def __init__(self, checkpoint_io: Optional[Any] = None, copy: str = "auto") -> None:
        if copy not in COPY_CHOICES:
            raise ValueError(f"copy={copy!r} is not valid: choose one of {list(COPY_CHOICES)}.")
        self.copy = copy
        super().__init__(checkpoint_io)
        self._told_host_copy = False

    @staticmethod
    def _default_writer() -> Any:
        """The plugin that writes when none is given: :class:`AtomicXLACheckpointIO`."""
        return AtomicXLACheckpointIO()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        refuse_storage_options(self, storage_options)
        self.wait()
        write = self.checkpoint_io.write  # type: ignore[union-attr]
        if self._copies_on_device(checkpoint):
            self._submit(_write_host_copy, write, [device_copy(checkpoint)], path)
        else:
            self._submit(write, host_copy(checkpoint), path)

    def _copies_on_device(self, checkpoint: dict[str, Any]) -> bool:
        if self.copy != "auto":
            return self.copy == "device"
        if device_copy_fits(checkpoint):
            return True
        if not self._told_host_copy:
            self._told_host_copy = True
            log.info(
                "A copy of the checkpoint does not fit on the device next to the run's peak memory (or the device"
                " reports no memory figures): it is copied to the host, and the training step waits for that copy"
                " (%s=host-copy chooses this without the check; device-copy copies on the device anyway).",
                WRITES_VARIABLE,
            )
        return False

    def save_sharded(
        self, path: _PATH, tensors: dict[str, Any], metadata: Optional[dict[str, Any]], **options: Any
    ) -> None:
        """Copy a sharded checkpoint to the host now; write it in the background (the wrapped ``write_sharded``).

        ``options`` go to ``write_sharded`` (see :meth:`AtomicXLACheckpointIO.write_sharded`).

        Raises:
            TypeError: the wrapped plugin has no ``write_sharded``.
        """
        write = getattr(self.checkpoint_io, "write_sharded", None)
        if not callable(write):
            raise TypeError(
                f"{type(self).__name__} writes sharded checkpoints through its plugin's `write_sharded`, which"
                f" {type(self.checkpoint_io).__name__} does not have; wrap AtomicXLACheckpointIO."
            )
        self.wait()
        self._submit(write, path, sharded_host_copy(tensors), _host_copy_or_none(metadata), **options)
