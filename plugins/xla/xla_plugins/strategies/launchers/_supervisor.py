"""The supervisor: starts one worker process per torch_xla local process and stops them all on the first failure.

Workers are started with the ``fork`` start method, as Lightning's XLA launchers do, one per local
process torch_xla's own multiprocessing would start (``torch_xla._internal.pjrt.run_multiprocess``:
one per TPU chip, or one driving every PJRT CPU device); each runs torch_xla's worker start-up and
one replica thread per device, exactly as ``xmp.spawn`` does. The main process reads each worker's
messages (:class:`~xla_plugins.strategies.launchers._failures._Channel`) and exit status; no helper
process (no ``multiprocessing.Manager``) is involved. Workers never outlive the main process: on
Linux each asks the kernel to kill it when the main process ends (``prctl(PR_SET_PDEATHSIG,
SIGKILL)``), elsewhere a thread watches the parent; every worker ends through ``os._exit``.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection, wait
from typing import Any, Optional

import torch.multiprocessing as mp
from lightning.pytorch.utilities.exceptions import SIGTERMException

from trainer_plugins.long_runs._stop_settings import exit_status
from xla_plugins.checkpoints.checkpoint_io import finish_pending_writes
from xla_plugins.long_runs import _stop_agreement
from xla_plugins.runtime import _torch_xla_contract
from xla_plugins.strategies.launchers._failures import (
    WorkerDiedError,
    WorkerTraceback,
    _Channel,
    _InProcessResults,
    _reported_failure,
)
from xla_plugins.strategies.launchers._watchdog import _run_one_replica, replica_timeout, start_watchdog

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def spawn_replicas(
    wrapping_function: Callable[..., None], args: tuple[Any, ...], devices: int, start_method: str
) -> Any:
    """Run ``wrapping_function(rank, *args, return_queue, error_queue)`` on every device; return what rank 0 queued.

    Args:
        wrapping_function: a callable (a bound launcher method) that runs one replica through
            :func:`~xla_plugins.strategies.launchers.run_replica` and puts local rank 0's result on
            ``return_queue``.
        args: its arguments after the rank.
        devices: the strategy's number of devices (1 makes torch_xla run the replica in this process).
        start_method: ``"fork"`` (Lightning's choice for XLA).

    Raises:
        ValueError: ``XLA_PLUGINS_REPLICA_TIMEOUT`` is not valid (before any worker starts).
        RuntimeError: the XLA runtime already runs in this process (as ``xmp.spawn`` refuses).
        BaseException: what a replica raised, with its traceback chained as ``__cause__``.
        WorkerDiedError: a worker ended by an exit code or a signal without reporting.
        ReplicaHangError: a replica made no progress within the replica timeout.
    """
    timeout = replica_timeout()
    if devices == 1:
        import torch_xla.distributed.xla_multiprocessing as xmp

        results = _InProcessResults()
        xmp.spawn(wrapping_function, args=(*args, results, results), nprocs=1, start_method=start_method)
        return results.value
    if _torch_xla_contract.runtime_is_initialized():
        raise RuntimeError(
            "The XLA runtime already runs in this process, so its workers cannot be started: do not use an XLA"
            " device in the main process before `trainer.fit`/`fabric.launch` with the multi-device XLA strategy."
        )
    return _Supervisor(mp.get_context(start_method), timeout).run(wrapping_function, args)


@dataclass
class _Worker:
    """What the main process knows of one worker process."""

    local_rank: int
    process: Any
    receiver: Connection
    ranks: list[int] = field(default_factory=list)
    finished: bool = False


class _Supervisor:
    """Starts the workers, collects their messages and exit statuses, and stops them all on the first failure."""

    def __init__(self, context: Any, timeout: Optional[float]) -> None:
        self._context = context
        self._timeout = timeout
        self._result: Any = None
        self._has_result = False
        self._failure: Optional[tuple[BaseException, Optional[WorkerTraceback]]] = None

    def run(self, wrapping_function: Callable[..., None], args: tuple[Any, ...]) -> Any:
        workers: list[_Worker] = []
        try:
            count = _local_process_count()
            for local_rank in range(count):
                receiver, sender = self._context.Pipe(duplex=False)
                process = self._context.Process(
                    target=_worker_main,
                    args=(local_rank, count, os.getpid(), _Channel(sender), wrapping_function, args, self._timeout),
                    name=f"xla-worker-{local_rank}",
                )
                process.start()
                sender.close()  # the worker holds the only sending end: its death is an end of file here
                workers.append(_Worker(local_rank, process, receiver))
            self._supervise(workers)
        finally:
            _stop(workers)
        if self._failure is not None:
            error, cause = self._failure
            raise error from cause
        if not self._has_result:
            raise RuntimeError("The XLA workers finished, but the replica of local rank 0 returned no result.")
        return self._result

    def _supervise(self, workers: list[_Worker]) -> None:
        by_receiver = {worker.receiver: worker for worker in workers}
        by_sentinel = {worker.process.sentinel: worker for worker in workers}
        while by_sentinel and self._failure is None:
            for handle in wait([*by_receiver, *by_sentinel]):
                if handle in by_receiver:
                    worker = by_receiver[handle]
                    if not self._read(worker):
                        del by_receiver[handle]
                elif handle in by_sentinel:
                    worker = by_sentinel.pop(handle)
                    worker.process.join()
                    while worker.receiver in by_receiver and self._read(worker):  # what it sent before it ended
                        pass
                    by_receiver.pop(worker.receiver, None)
                    if self._failure is None and not worker.finished:
                        self._failure = (_stopped_past_the_deadline(worker) or _died(worker), None)
                if self._failure is not None:
                    return

    def _read(self, worker: _Worker) -> bool:
        """Handle one message of ``worker``; ``False`` at the end of its pipe."""
        try:
            message = pickle.loads(worker.receiver.recv_bytes())
        except (EOFError, OSError):
            return False
        except Exception as error:  # noqa: BLE001 - a message that cannot be rebuilt here
            message = ("failure", -1, None, f"A message of an XLA worker could not be read: {error!r}")
        kind = message[0]
        if kind == "started":
            worker.ranks.append(message[1])
        elif kind == "result":
            self._result, self._has_result = message[1], True
        elif kind == "finished":
            worker.finished = True
        elif kind == "failure" and self._failure is None:
            self._failure = _reported_failure(*message[1:])
        return True


def _local_process_count() -> int:
    """How many worker processes torch_xla's ``run_multiprocess`` starts on this host for the active PJRT device.

    One per TPU chip (``tpu.num_local_processes``), per Neuron core group, per GPU with torch_xla 2.8
    (2.9 has no CUDA device and starts one); one driving every device elsewhere (PJRT CPU).
    """
    import torch_xla.runtime as xr
    from torch_xla.experimental import plugins

    if plugins.using_dynamic_plugins():
        return int(plugins.default().physical_chip_count())
    count = _torch_xla_contract.num_local_processes(str(xr.device_type()))
    return 1 if count is None else count


def _stop(workers: list[_Worker]) -> None:
    """Kill every worker still running and reap all of them."""
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()
    for worker in workers:
        worker.process.join()
        worker.receiver.close()


def _stopped_past_the_deadline(worker: _Worker) -> Optional[BaseException]:
    """Lightning's ``SIGTERMException`` with the stop's exit status, if ``worker`` ended with it during a stop.

    A replica whose stop checkpoint misses ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` ends its worker with
    the stop's status (128 + the signal) without reporting (the deadline cannot wait for the
    replica); the main process then exits with that status too, as after a stop that wrote its
    checkpoint, not as after a dead worker.
    """
    host_stop = _stop_agreement.host_stop
    signum = host_stop.requested_signal() if host_stop is not None else None
    if signum is None or worker.process.exitcode != exit_status(signum):
        return None
    return SIGTERMException(exit_status(signum))  # a SystemExit: its code is the status


def _died(worker: _Worker) -> WorkerDiedError:
    code = worker.process.exitcode
    if code is not None and code < 0:
        try:
            cause = f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            cause = f"was killed by signal {-code}"
        if code == -signal.SIGKILL:
            cause += " (sent by a user, or by the out-of-memory killer)"
    else:
        cause = f"exited with code {code}"
    ranks = tuple(sorted(worker.ranks))
    who = (
        f"running the replica{'s' if len(ranks) > 1 else ''} of rank{'s' if len(ranks) > 1 else ''}"
        f" {', '.join(map(str, ranks))}"
        if ranks
        else "before its replicas started"
    )
    return WorkerDiedError(
        f"The XLA worker process {worker.process.pid} (local process {worker.local_rank}) {who} {cause}"
        " without reporting an exception.",
        ranks,
        code,
    )


def _initialize_worker(local_rank: int, local_world_size: int) -> None:
    """torch_xla's worker start-up (``pjrt.initialize_multiprocess``), then torch's autograd engine, once.

    torch sizes its autograd engine's per-device queues on the first backward pass of a process.
    When that first pass was left to the replica threads (each runs one at setup), a replica's
    backward pass now and then failed torch's ``device_ready_queues_`` assert on 4 PJRT CPU devices
    (three times in a day's test runs, torch_xla 2.8 and 2.9): the engine had been sized for fewer
    devices than the worker drives. One backward pass here, in the worker's only thread after the
    runtime started, sizes the engine before any replica runs; no launch has failed that way since.
    """
    import torch
    import torch_xla

    _torch_xla_contract.initialize_multiprocess(local_rank, local_world_size)
    torch.zeros(1, device=torch_xla.device(), requires_grad=True).sum().backward()


def _worker_main(
    local_rank: int,
    local_world_size: int,
    main_pid: int,
    channel: _Channel,
    wrapping_function: Callable[..., None],
    args: tuple[Any, ...],
    timeout: Optional[float],
) -> None:
    """A worker process: die with the main process, run torch_xla's start-up and one replica per device."""
    code = 1
    try:
        _die_with(main_pid)
        start_watchdog(channel, timeout)
        replica = partial(_run_one_replica, channel, wrapping_function, args)
        _torch_xla_contract.run_thread_per_device(local_rank, local_world_size, replica, _initialize_worker)
        finish_pending_writes()  # os._exit below would cut a background checkpoint write short
        channel.send("finished")
        code = 0
    except BaseException as error:  # noqa: BLE001 - the start-up failed: report it, never return into the fork
        try:
            channel.report(-1, error)
        except BaseException:  # noqa: BLE001, S110
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001, S110
                pass
        os._exit(code)


def _die_with(parent_pid: int) -> None:
    """Make this worker end when the process ``parent_pid`` ends, however it ends.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills the worker when its parent
    dies (also by ``SIGKILL``); if the parent died before that, the worker leaves at once. Elsewhere:
    a daemon thread that ends the worker once its parent process id changes.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch_parent, args=(parent_pid,), name="xla-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)
