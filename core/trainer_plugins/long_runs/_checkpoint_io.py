"""Checkpoint IO plugins for every backend: atomic writes, and writes in a background thread.

:class:`AtomicCheckpointIO` makes a checkpoint file visible only once it is complete
(:mod:`trainer_plugins.long_runs._commits`): on a local disk written under a temporary name, then
renamed; on an fsspec filesystem (an object store has no atomic rename) moved into place, then
marked complete by the commit marker ``<path>.commit`` holding its size in bytes
(:func:`~trainer_plugins.long_runs._commits.is_committed`). :class:`BackgroundCheckpointIO` builds on
Lightning's ``AsyncCheckpointIO``: the training thread copies the state to the host and returns, a
writer thread writes it, at most one write is in flight. A backend whose device copies or sharded
checkpoints need more subclasses both in its own plugin.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO, Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io.async_plugin import AsyncCheckpointIO

from trainer_plugins.long_runs import _commits

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` (``torch.save``), made atomic: a checkpoint file appears only whole.

    Written to a temporary file ``.<name>.tmp-<host>-<pid>-<id>`` in the target's directory; on a
    local disk flushed, ``fsync``-ed and renamed over the target with ``os.replace`` (atomic on
    POSIX), so a process killed during the write leaves the previous file in place; on an fsspec URL
    moved onto ``path``, then the commit marker ``<path>.commit`` is written with the byte size, and
    a checkpoint counts as complete only with its marker (:meth:`is_committed`). The temporary names
    never match Lightning's ``last*.ckpt`` pattern. Each write and each ``load_checkpoint`` first
    removes the temporary files that killed writers of this host left in the checkpoint's directory
    (:func:`~trainer_plugins.long_runs._commits.remove_stale_temporaries`).

    Raises:
        TypeError: ``storage_options`` given to a save (as Lightning's ``TorchCheckpointIO``).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        refuse_storage_options(self, storage_options)
        self.write(checkpoint, path)

    def write(self, checkpoint: dict[str, Any], path: _PATH) -> None:
        """Write ``checkpoint`` (host tensors) atomically to the file ``path`` (see the class docstring)."""
        path = str(path)
        fs = get_filesystem(path)
        directory = os.path.dirname(path)
        if directory:
            fs.makedirs(directory, exist_ok=True)
        remove_stale_temporaries(directory)
        temporary = _commits.temporary_path(path)
        local = _commits.is_local(path)
        try:
            with open(temporary, "wb") if local else fs.open(temporary, "wb") as stream:
                self._write_to(checkpoint, stream)
                if local:
                    stream.flush()
                    os.fsync(stream.fileno())
            _commits.commit(temporary, path)
        finally:
            if fs.exists(temporary):
                fs.rm(temporary)

    def _write_to(self, checkpoint: dict[str, Any], stream: IO[bytes]) -> None:
        """Serialise ``checkpoint`` into ``stream`` with ``torch.save``."""
        torch.save(checkpoint, stream)

    def load_checkpoint(self, path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Lightning's ``load_checkpoint``, after removing the temporary files of killed writers beside ``path``."""
        remove_stale_temporaries(os.path.dirname(str(path)))
        return super().load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: _PATH) -> None:
        """Remove the checkpoint ``path`` (a file or a sharded checkpoint's directory) and its commit marker, if any."""
        _commits.remove(path)

    def is_committed(self, path: _PATH) -> bool:
        """See :func:`~trainer_plugins.long_runs._commits.is_committed`."""
        return _commits.is_committed(path)


def remove_stale_temporaries(directory: str) -> None:
    """:func:`~trainer_plugins.long_runs._commits.remove_stale_temporaries` of ``directory``, logged.

    An error is only logged too."""
    try:
        removed = _commits.remove_stale_temporaries(directory)
    except OSError as error:
        log.warning("The temporary files of killed checkpoint writes in %r could not be removed: %r", directory, error)
        return
    for path in removed:
        log.info("Removed %s, the temporary file of a checkpoint write whose process was killed.", path)


def refuse_storage_options(io: Any, storage_options: Optional[Any]) -> None:
    """Raise ``TypeError`` naming ``io``'s class if ``storage_options`` is given (as Lightning's checkpoint IO does)."""
    if storage_options is not None:
        raise TypeError(
            f"`storage_options` is not supported by `{type(io).__name__}`; got {storage_options!r}."
            " Give your own `CheckpointIO` plugin to use them."
        )


def host_copy(checkpoint: Any) -> Any:
    """``checkpoint`` with every tensor copied to the CPU now, on the calling thread (a point-in-time copy)."""
    return apply_to_collection(checkpoint, torch.Tensor, lambda tensor: tensor.detach().to("cpu", copy=True))


#: Every background checkpoint IO of this process, for :func:`finish_pending_writes`.
_WRITERS: weakref.WeakSet[BackgroundCheckpointIO] = weakref.WeakSet()


def finish_pending_writes() -> None:
    """Wait for the write in flight of every :class:`BackgroundCheckpointIO` of this process.

    Called by a worker process before it ends through ``os._exit`` (which would cut a write short),
    and when the interpreter exits (:func:`_finish_at_exit`).

    Raises:
        BaseException: what a write raised.
    """
    for writer in list(_WRITERS):
        writer.wait()


@atexit.register
def _finish_at_exit() -> None:
    """At the interpreter's normal exit: wait for every write in flight, and log any that failed.

    A script using Fabric, or a strategy on its own, has no end of ``fit`` to wait at. Python joins
    the writer thread of Lightning's ``AsyncCheckpointIO`` (a ``ThreadPoolExecutor``'s) before
    ``atexit`` functions run; this wait covers a writer that Python would not join (a daemon
    thread), and it reports a failed write, which nothing would raise otherwise (an error here
    cannot change the exit status).
    """
    for writer in list(_WRITERS):
        try:
            writer.wait()
        except BaseException as error:  # noqa: BLE001 - reported, the interpreter is ending
            log.error("A checkpoint written in the background failed: %r", error)


class BackgroundCheckpointIO(AsyncCheckpointIO):
    """Lightning's ``AsyncCheckpointIO``, one write in flight: the step waits only for a copy of the state.

    ``save_checkpoint`` first waits for the write in flight (at most one: the host holds one copy
    of the state), copies the checkpoint to the host on the calling thread (:func:`host_copy`),
    then hands the copy to a writer thread, which calls the wrapped plugin's ``write`` (default
    :class:`AtomicCheckpointIO`). ``load_checkpoint``, ``remove_checkpoint`` and ``teardown`` wait
    for the write in flight first (so ``trainer.fit`` returns after the last write: Lightning tears
    the strategy's checkpoint IO down at the end of ``fit``); a save after ``teardown`` starts a new
    writer; the interpreter's normal exit waits too (:func:`_finish_at_exit`). An error of a write
    is raised by the next call that waits (:meth:`wait`).

    Args:
        checkpoint_io: the plugin that writes; it needs a ``write(checkpoint, path)`` method taking
            host tensors. Default: :class:`AtomicCheckpointIO`.

    Raises:
        TypeError: ``checkpoint_io`` has no ``write`` method, or ``storage_options`` given to a save.
    """

    def __init__(self, checkpoint_io: Optional[Any] = None) -> None:
        checkpoint_io = self._default_writer() if checkpoint_io is None else checkpoint_io
        if not callable(getattr(checkpoint_io, "write", None)):
            raise TypeError(
                f"{type(self).__name__} needs a checkpoint IO with a `write(checkpoint, path)` method, such as"
                f" {type(self._default_writer()).__name__}; got {type(checkpoint_io).__name__}."
            )
        super().__init__(checkpoint_io)
        self._pending: Optional[Future] = None
        self._pid = os.getpid()
        _WRITERS.add(self)

    @staticmethod
    def _default_writer() -> Any:
        """The plugin that writes when none is given: :class:`AtomicCheckpointIO`."""
        return AtomicCheckpointIO()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_executor=None, _pending=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _WRITERS.add(self)

    def _ensure_setup(self) -> None:
        if self._pid != os.getpid():  # a forked worker: the parent's writer thread does not exist here
            self._executor, self._pending, self._pid = None, None, os.getpid()
        super()._ensure_setup()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        refuse_storage_options(self, storage_options)
        self.wait()
        self._submit(self.checkpoint_io.write, host_copy(checkpoint), path)  # type: ignore[union-attr]

    def _submit(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        self._ensure_setup()
        assert self._executor is not None
        self._pending = self._executor.submit(self._write, write, *args, **kwargs)

    def _write(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            write(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - raised on the training thread by the next wait
            self._error = error

    def wait(self) -> None:
        """Block until the write in flight (if any) is complete.

        Raises:
            BaseException: what a write raised since the last call (raised once).
        """
        pending = self._pending
        if pending is not None and self._pid == os.getpid():
            pending.result()  # interrupted (a stop signal's SystemExit), the write stays pending for the next wait
        self._pending = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.wait()
        return super().load_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.wait()
        super().remove_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        self.wait()
        super().teardown()

    def is_committed(self, path: _PATH) -> bool:
        """Whether ``path`` is a complete checkpoint (the wrapped plugin's rule; else ``_commits.is_committed``)."""
        rule = getattr(self.checkpoint_io, "is_committed", None)
        return bool(rule(path)) if callable(rule) else _commits.is_committed(path)
