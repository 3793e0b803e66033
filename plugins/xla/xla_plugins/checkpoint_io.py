"""Checkpoint IO plugins of the XLA strategies: atomic writes, and writes in a background thread.

:class:`AtomicXLACheckpointIO` makes a checkpoint visible only once it is complete: on a local disk
a temporary file in the same directory, ``fsync``, then ``os.replace``; on an fsspec filesystem
(an object store has no atomic rename) a temporary object moved into place, then a commit marker
``<path>.commit`` holding the byte size (:func:`is_committed`). :class:`BackgroundXLACheckpointIO`
builds on Lightning's ``AsyncCheckpointIO``: the training thread copies the state to the host and
returns, a writer thread writes it, at most one write is in flight.

The setting :data:`WRITES_VARIABLE` (``background``, the default, or ``sync``) chooses which of the
two the XLA strategies of the Trainer use by default (:func:`default_checkpoint_io`).
"""

from __future__ import annotations

import os
import uuid
import weakref
from concurrent.futures import Future
from typing import IO, Any, Optional

import fsspec
import torch
from lightning.fabric.plugins.io.xla import XLACheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io.async_plugin import AsyncCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from xla_plugins import _torch_xla_contract

#: Environment variable choosing how the XLA strategies of the Trainer write checkpoints by default.
WRITES_VARIABLE = "XLA_PLUGINS_CHECKPOINT_WRITES"
#: Valid values of :data:`WRITES_VARIABLE`: a writer thread (default), or on the training thread.
WRITES_CHOICES = ("background", "sync")
#: Suffix of the commit marker written beside a checkpoint on a non-local filesystem.
COMMIT_SUFFIX = ".commit"


def checkpoint_writes() -> str:
    """The value of :data:`WRITES_VARIABLE`: ``"background"`` (unset or blank) or ``"sync"``.

    Raises:
        ValueError: another value; the message names it and the choices.
    """
    text = os.environ.get(WRITES_VARIABLE, "").strip().lower() or WRITES_CHOICES[0]
    if text not in WRITES_CHOICES:
        raise ValueError(
            f"{WRITES_VARIABLE}={os.environ[WRITES_VARIABLE]!r} is not valid: choose one of {list(WRITES_CHOICES)}"
            " ('background': the training step waits only for the copy to the host; 'sync': it waits for the write)."
        )
    return text


def default_checkpoint_io() -> XLACheckpointIO | AsyncCheckpointIO:
    """The checkpoint IO of an XLA strategy given none: atomic writes, in the background unless the setting is ``sync``.

    See :func:`checkpoint_writes`.

    Raises:
        ValueError: see :func:`checkpoint_writes`.
    """
    atomic = AtomicXLACheckpointIO()
    return atomic if checkpoint_writes() == "sync" else BackgroundXLACheckpointIO(atomic)


def _is_local(path: _PATH) -> bool:
    """Whether ``path`` is on the local filesystem (fsspec protocol ``file``, as Lightning decides)."""
    return fsspec.utils.get_protocol(str(path)) == "file"


def is_committed(path: _PATH) -> bool:
    """Whether the checkpoint file ``path`` is complete, as written by :class:`AtomicXLACheckpointIO`.

    On a local disk: the file exists (it only ever appears whole, by ``os.replace``). Elsewhere
    (fsspec URLs): the file and its marker ``<path>.commit`` exist and the marker holds the file's
    byte size.
    """
    fs = get_filesystem(path)
    if not fs.exists(path):
        return False
    if _is_local(path):
        return True
    marker = f"{path}{COMMIT_SUFFIX}"
    if not fs.exists(marker):
        return False
    with fs.open(marker, "rb") as stream:
        text = stream.read().decode(errors="replace").strip()
    return text == str(fs.size(path))


class AtomicXLACheckpointIO(XLACheckpointIO):
    """Lightning's ``XLACheckpointIO`` (CPU tensors, ``torch.save``), made atomic: a checkpoint appears only whole.

    Local paths: written to a temporary file ``.<name>.tmp-<id>`` in the target's directory,
    flushed and ``fsync``-ed, then renamed over the target with ``os.replace`` (atomic on POSIX), so
    a process killed during the write leaves the previous file in place; the temporary name never
    matches Lightning's ``last*.ckpt`` pattern. fsspec URLs: the commit marker ``<path>.commit`` is
    removed, the bytes go to a temporary object, which is moved onto ``path``, then the marker is
    written with the byte size; a checkpoint counts as complete only with its marker
    (:func:`is_committed`).

    Raises:
        TypeError: ``storage_options`` given (as Lightning's ``XLACheckpointIO``).
        ModuleNotFoundError: torch_xla is not installed.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"`storage_options` is not supported by `{type(self).__name__}`; got {storage_options!r}."
                " Give your own `CheckpointIO` plugin to use them."
            )
        self.write(_torch_xla_contract.convert_to_cpu(checkpoint), path)

    def write(self, checkpoint: dict[str, Any], path: _PATH) -> None:
        """Write ``checkpoint`` (CPU tensors only) atomically to ``path`` (see the class docstring)."""
        path = str(path)
        fs = get_filesystem(path)
        directory = os.path.dirname(path)
        if directory:
            fs.makedirs(directory, exist_ok=True)
        temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
        if _is_local(path):
            try:
                with open(temporary, "wb") as stream:
                    self._write_to(checkpoint, stream)
                    stream.flush()
                    os.fsync(stream.fileno())
                os.replace(temporary, path)
            finally:
                if os.path.exists(temporary):
                    os.remove(temporary)
            return
        marker = f"{path}{COMMIT_SUFFIX}"
        if fs.exists(marker):
            fs.rm(marker)
        try:
            with fs.open(temporary, "wb") as stream:
                self._write_to(checkpoint, stream)
            fs.mv(temporary, path)
        finally:
            if fs.exists(temporary):
                fs.rm(temporary)
        with fs.open(marker, "wb") as stream:
            stream.write(str(fs.size(path)).encode())

    def _write_to(self, checkpoint: dict[str, Any], stream: IO[bytes]) -> None:
        """Serialise ``checkpoint`` into ``stream`` with ``torch.save``."""
        torch.save(checkpoint, stream)

    def remove_checkpoint(self, path: _PATH) -> None:
        """Remove ``path`` and its commit marker, if any."""
        super().remove_checkpoint(path)
        fs = get_filesystem(path)
        marker = f"{path}{COMMIT_SUFFIX}"
        if not _is_local(path) and fs.exists(marker):
            fs.rm(marker)

    def is_committed(self, path: _PATH) -> bool:
        """See :func:`is_committed`."""
        return is_committed(path)


def host_copy(checkpoint: Any) -> Any:
    """A copy of ``checkpoint`` the training thread may keep changing: XLA tensors on the CPU, CPU tensors cloned.

    The XLA tensors go to the CPU together (torch_xla's ``xm._maybe_convert_to_cpu``, as Lightning's
    ``XLACheckpointIO``); CPU tensors are cloned (as Lightning's ``AsyncCheckpointIO`` clones
    every tensor), since the training thread may change them in place after the hand-off.
    """
    cloned = apply_to_collection(
        checkpoint, torch.Tensor, lambda t: t if t.device.type == "xla" else t.detach().clone()
    )
    return _torch_xla_contract.convert_to_cpu(cloned)


#: Every background checkpoint IO of this process, for :func:`finish_pending_writes`.
_WRITERS: weakref.WeakSet[BackgroundXLACheckpointIO] = weakref.WeakSet()


def finish_pending_writes() -> None:
    """Wait for the write in flight of every :class:`BackgroundXLACheckpointIO` of this process.

    Called by a spawn worker before it ends (it ends through ``os._exit``, which would cut a write short).

    Raises:
        BaseException: what a write raised.
    """
    for writer in list(_WRITERS):
        writer.wait()


class BackgroundXLACheckpointIO(AsyncCheckpointIO):
    """Lightning's ``AsyncCheckpointIO`` for XLA: the step waits only for the copy to the host.

    ``save_checkpoint`` first waits for the write in flight (at most one: the host holds one copy
    of the state), copies the checkpoint to the host on the calling thread (:func:`host_copy`),
    then hands it to a writer thread, which calls the wrapped plugin's ``write`` (default
    :class:`AtomicXLACheckpointIO`). ``load_checkpoint``, ``remove_checkpoint`` and ``teardown``
    wait for the write in flight first (so ``trainer.fit`` returns after the last write: Lightning
    tears the strategy's checkpoint IO down at the end of ``fit``); a save after ``teardown``
    starts a new writer. An error of a write is raised by the next call that waits.

    Args:
        checkpoint_io: the plugin that writes; it needs a ``write(checkpoint, path)`` method taking
            CPU tensors (:class:`AtomicXLACheckpointIO` has one). Default: :class:`AtomicXLACheckpointIO`.

    Raises:
        TypeError: ``checkpoint_io`` has no ``write`` method, or ``storage_options`` given to a save.
    """

    def __init__(self, checkpoint_io: Optional[Any] = None) -> None:
        checkpoint_io = AtomicXLACheckpointIO() if checkpoint_io is None else checkpoint_io
        if not callable(getattr(checkpoint_io, "write", None)):
            raise TypeError(
                f"{type(self).__name__} needs a checkpoint IO with a `write(checkpoint, path)` method, such as"
                f" AtomicXLACheckpointIO; got {type(checkpoint_io).__name__}."
            )
        super().__init__(checkpoint_io)
        self._pending: Optional[Future] = None
        self._pid = os.getpid()
        _WRITERS.add(self)

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
        if storage_options is not None:
            raise TypeError(
                f"`storage_options` is not supported by `{type(self).__name__}`; got {storage_options!r}."
                " Give your own `CheckpointIO` plugin to use them."
            )
        self.wait()
        copy = host_copy(checkpoint)
        self._ensure_setup()
        assert self._executor is not None
        self._pending = self._executor.submit(self._write, copy, path)

    def _write(self, checkpoint: dict[str, Any], path: _PATH) -> None:
        try:
            self.checkpoint_io.write(checkpoint, path)  # type: ignore[union-attr]
        except BaseException as error:  # noqa: BLE001 - raised on the training thread by the next wait
            self._error = error

    def wait(self) -> None:
        """Block until the write in flight (if any) is complete.

        Raises:
            BaseException: what a write raised since the last call (raised once).
        """
        pending, self._pending = self._pending, None
        if pending is not None and self._pid == os.getpid():
            pending.result()
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
        """Whether ``path`` is a complete checkpoint (the wrapped plugin's rule; else :func:`is_committed`)."""
        rule = getattr(self.checkpoint_io, "is_committed", None)
        return bool(rule(path)) if callable(rule) else is_committed(path)
