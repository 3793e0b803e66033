"""What a replica's failure is, and how it travels from a worker process to the main process.

The bottom of the launchers: the errors the main process raises (:class:`WorkerTraceback`,
:class:`WorkerDiedError`, :class:`ReplicaHangError`), the one-way pipe a worker reports on
(:class:`_Channel`) and :func:`run_replica`, which ends a worker at its replica's first exception.
"""

from __future__ import annotations

import os
import pickle
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Optional


class WorkerTraceback(Exception):
    """The traceback of an exception raised in an XLA worker, chained as ``__cause__`` in the main process."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class WorkerDiedError(RuntimeError):
    """An XLA worker process ended without reporting an exception (an exit code or a signal).

    Attributes:
        ranks: the global ranks of the replicas the worker ran (empty if it died before they started).
        exitcode: the process's exit code, or minus the number of the signal that killed it.
    """

    def __init__(self, message: str, ranks: tuple[int, ...], exitcode: Optional[int]) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.exitcode = exitcode

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.ranks, self.exitcode)


class ReplicaHangError(TimeoutError):
    """A replica made no progress for longer than the replica timeout (``XLA_PLUGINS_REPLICA_TIMEOUT``).

    Attributes:
        rank: the global rank of the replica.
    """

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.rank)


def run_replica(main_pid: int, channel: Any, replica: Callable[[], None]) -> None:
    """Run one replica; in a worker process, report a failure and end the worker at once.

    Args:
        main_pid: the process id of the main process (where torch_xla runs a single replica itself:
            there the exception propagates).
        channel: the worker's :class:`_Channel` to the main process.
        replica: the replica's work.
    """
    try:
        replica()
    except BaseException as error:
        if os.getpid() == main_pid:
            raise
        import torch_xla.runtime as xr

        try:
            channel.report(xr.global_ordinal(), error)
        finally:
            os._exit(1)


class _InProcessResults:
    """The return queue when the single replica runs in the main process."""

    value: Any = None

    def put(self, value: Any) -> None:
        self.value = value


class _Channel:
    """A worker's one-way pipe to the main process, shared by its replica threads and its watchdog.

    Messages: ``("started", rank)``, ``("result", value)`` (Lightning's return queue),
    ``("failure", rank, pickled exception or None, traceback text)``, ``("finished",)``.
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()

    def send(self, *message: Any) -> None:
        if not self._lock.acquire(timeout=30):  # a sender that died mid-message cannot block the report
            return
        try:  # plain pickle: tensors travel by value (torch's ForkingPickler would share them through the worker)
            self._connection.send_bytes(pickle.dumps(message))
        finally:
            self._lock.release()

    def put(self, value: Any) -> None:
        """Lightning's ``return_queue.put``: sends ``value`` only from the replica of local rank 0.

        Lightning's launchers put from every replica thread when a worker drives several devices (they
        ask the launcher's own strategy for the local rank, which is 0 in every thread), so the
        replica's rank is read from torch_xla (``torch_xla.runtime.local_ordinal``, per thread).
        """
        import torch_xla.runtime as xr

        if xr.local_ordinal() == 0:
            self.send("result", value)

    def report(self, rank: int, error: BaseException, text: Optional[str] = None) -> None:
        """Report ``error`` of replica ``rank`` (with ``text`` as its traceback, if given)."""
        reported_rank, pickled, formatted = _report(rank, error)
        self.send("failure", reported_rank, pickled, text if text is not None else formatted)


def _report(rank: int, error: BaseException) -> tuple[int, Optional[bytes], str]:
    """(rank, the pickled exception or ``None`` if it cannot be pickled, its formatted traceback)."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        pickled: Optional[bytes] = pickle.dumps(error)
    except Exception:
        pickled = None
    return rank, pickled, text


def _reported_failure(
    rank: int, pickled: Optional[bytes], text: str
) -> tuple[BaseException, Optional[WorkerTraceback]]:
    """The exception a worker reported, rebuilt, and its traceback text."""
    try:
        error = pickle.loads(pickled) if pickled is not None else None
    except Exception:  # pickled, but it cannot be rebuilt here (e.g. an __init__ with other arguments)
        error = None
    who = f"XLA replica of rank {rank}" if rank >= 0 else "XLA worker (outside its replicas)"
    if not isinstance(error, BaseException):
        error = RuntimeError(f"{who} failed: {text.strip().splitlines()[-1]}")
    return error, WorkerTraceback(f"\n\n{who} raised:\n{text}")
