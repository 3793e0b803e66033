"""Launchers of the multi-device XLA strategy: one worker per device, all stopped on the first failure.

Both flavours (``lightning.Trainer`` and ``lightning.Fabric``) start their workers with
:func:`spawn_replicas` and run each replica inside :func:`run_replica`:

* workers are started with the ``fork`` start method, as Lightning's XLA launchers do (guard the
  entry script with ``if __name__ == "__main__":``), one per local process torch_xla's own
  multiprocessing would start (``torch_xla._internal.pjrt.run_multiprocess``: one per TPU chip, or
  one driving every PJRT CPU device); each worker runs torch_xla's worker start-up and one replica
  thread per device (``pjrt._run_thread_per_device``), exactly as ``xmp.spawn`` does. The launcher
  starts the processes itself so that it knows each worker's ranks and exit status; no helper
  process (no ``multiprocessing.Manager``) is involved;
* **a replica that raises** reports its exception and traceback to the main process and ends its
  worker process at once, its other device threads included; the other workers are then killed,
  and the main process raises the replica's exception with the worker traceback chained as
  ``__cause__`` (a :class:`WorkerTraceback`);
* **a worker that dies** without reporting (``os._exit``, a signal such as ``SIGKILL`` from the
  out-of-memory killer, a crash in native code) is reported as :class:`WorkerDiedError`, naming its
  process id, the ranks it ran and its exit code or signal;
* **a replica that hangs** (no batch, optimizer step or collective for
  :data:`REPLICA_TIMEOUT_VARIABLE` seconds, 30 minutes by default) is reported as
  :class:`ReplicaHangError` with its rank and where it is stuck;
* **workers never outlive the main process**: on Linux each worker asks the kernel to kill it when
  the main process ends (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), whatever ends it, ``SIGKILL``
  included; elsewhere a thread of the worker watches its parent. Every worker ends through
  ``os._exit`` in a ``finally`` block, so no exception path returns into the forked copy of the
  main program.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import TYPE_CHECKING, Any, Optional

import torch.multiprocessing as mp
from lightning.fabric.strategies.launchers.xla import _XLALauncher as _LightningFabricXLALauncher
from lightning.pytorch.strategies.launchers.multiprocessing import _WorkerOutput
from lightning.pytorch.strategies.launchers.xla import _XLALauncher as _LightningXLALauncher
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from xla_plugins import _runtime

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: Environment variable: seconds a replica may go without progress (a batch, an optimizer step, a
#: collective of its strategy: see :func:`progress`) before it is reported as hung
#: and the run stops. ``0`` turns the watch off. Default :data:`DEFAULT_REPLICA_TIMEOUT_S`. Read in
#: the main process when the workers start. Give a value above the longest XLA compilation a step
#: can take (a large model's: many minutes) and above the longest work of your own between two steps.
REPLICA_TIMEOUT_VARIABLE = "XLA_PLUGINS_REPLICA_TIMEOUT"
#: Default of :data:`REPLICA_TIMEOUT_VARIABLE`: 30 minutes.
DEFAULT_REPLICA_TIMEOUT_S = 1800.0
#: Seconds between two looks at the replicas' progress stamps.
_SAMPLE_INTERVAL_S = 0.5
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_STDLIB = sysconfig.get_paths()["stdlib"]


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
    """A replica made no progress for longer than the replica timeout (:data:`REPLICA_TIMEOUT_VARIABLE`).

    Attributes:
        rank: the global rank of the replica.
    """

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.rank)


def replica_timeout() -> Optional[float]:
    """Seconds from :data:`REPLICA_TIMEOUT_VARIABLE` (default :data:`DEFAULT_REPLICA_TIMEOUT_S`); ``None`` if ``0``.

    Raises:
        ValueError: the variable is not a number of seconds >= 0 (the message names it and its value).
    """
    seconds = _runtime.seconds_from_environment(
        REPLICA_TIMEOUT_VARIABLE,
        DEFAULT_REPLICA_TIMEOUT_S,
        "the seconds a replica may make no progress before the run stops (0 turns the watch off)",
    )
    return seconds or None


def spawn_replicas(
    wrapping_function: Callable[..., None], args: tuple[Any, ...], devices: int, start_method: str
) -> Any:
    """Run ``wrapping_function(rank, *args, return_queue, error_queue)`` on every device; return what rank 0 queued.

    Args:
        wrapping_function: a callable (a bound launcher method) that runs one replica through
            :func:`run_replica` and puts local rank 0's result on ``return_queue``.
        args: its arguments after the rank.
        devices: the strategy's number of devices (1 makes torch_xla run the replica in this process).
        start_method: ``"fork"`` (Lightning's choice for XLA).

    Raises:
        ValueError: :data:`REPLICA_TIMEOUT_VARIABLE` is not valid (before any worker starts).
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
    import torch_xla

    if torch_xla._XLAC._xla_runtime_is_initialized():
        raise RuntimeError(
            "The XLA runtime already runs in this process, so its workers cannot be started: do not use an XLA"
            " device in the main process before `trainer.fit`/`fabric.launch` with the multi-device XLA strategy."
        )
    return _Supervisor(mp.get_context(start_method), timeout).run(wrapping_function, args)


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
        """Lightning's ``return_queue.put``: local rank 0's result."""
        self.send("result", value)

    def report(self, rank: int, error: BaseException, text: Optional[str] = None) -> None:
        """Report ``error`` of replica ``rank`` (with ``text`` as its traceback, if given)."""
        reported_rank, pickled, formatted = _report(rank, error)
        self.send("failure", reported_rank, pickled, text if text is not None else formatted)


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
                        self._failure = (_died(worker), None)
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
    """How many worker processes torch_xla's ``run_multiprocess`` starts on this host for the active PJRT device."""
    import torch_xla.runtime as xr
    from torch_xla.experimental import plugins

    if plugins.using_dynamic_plugins():
        return int(plugins.default().physical_chip_count())
    device_type = xr.device_type()
    if device_type == "TPU":
        from torch_xla._internal import tpu

        return int(tpu.num_local_processes())
    if device_type == "NEURON":
        from torch_xla._internal import neuron

        return int(neuron.num_local_processes())
    if device_type == "CUDA":
        try:  # torch_xla 2.8 starts one process per GPU; 2.9 has no such module and starts one
            from torch_xla._internal import gpu  # type: ignore[attr-defined]
        except ImportError:
            return 1
        return int(gpu.num_local_processes())
    return 1


def _stop(workers: list[_Worker]) -> None:
    """Kill every worker still running and reap all of them."""
    for worker in workers:
        if worker.process.is_alive():
            worker.process.kill()
    for worker in workers:
        worker.process.join()
        worker.receiver.close()


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
    from torch_xla._internal import pjrt

    pjrt.initialize_multiprocess(local_rank, local_world_size)
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
        from torch_xla._internal import pjrt

        global _watchdog
        _watchdog = _Watchdog(channel, timeout) if timeout else None
        replica = partial(_run_one_replica, channel, wrapping_function, args)
        pjrt._run_thread_per_device(local_rank, local_world_size, replica, _initialize_worker)
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


def _run_one_replica(channel: _Channel, wrapping_function: Callable[..., None], args: tuple[Any, ...]) -> None:
    """One replica thread of a worker (its frame marks where the replica's own stack begins)."""
    import torch_xla.runtime as xr

    rank = xr.global_ordinal()
    channel.send("started", rank)
    if _watchdog is not None:
        _watchdog.watch(rank)
    try:
        wrapping_function(rank, *args, channel, channel)
    finally:
        if _watchdog is not None:
            _watchdog.forget()


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


class _Watchdog:
    """Reports a replica of this worker that made no progress (see :func:`progress`) for longer than the timeout.

    The replicas stamp the time of their progress into a dictionary; the watch's thread only
    compares those times with the clock, twice a second. It reads the replicas' Python stacks
    (``sys._current_frames``) once, to write the report, when the run is already given up. The
    replica reported is the one whose progress is oldest: when one replica hangs, the others
    soon wait for it in a collective, which they entered later.
    """

    def __init__(self, channel: _Channel, timeout: float) -> None:
        self._channel = channel
        self._timeout = timeout
        self._ranks: dict[int, int] = {}  # thread id -> rank
        self._stamps: dict[int, float] = {}  # thread id -> time.monotonic() of its latest progress
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def watch(self, rank: int) -> None:
        """Watch the calling thread, the replica of ``rank``, from now on."""
        ident = threading.get_ident()
        with self._lock:
            self._stamps[ident] = time.monotonic()
            self._ranks[ident] = rank
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="xla-replica-watchdog", daemon=True)
                self._thread.start()

    def forget(self) -> None:
        """Stop watching the calling thread."""
        ident = threading.get_ident()
        with self._lock:
            self._ranks.pop(ident, None)
            self._stamps.pop(ident, None)

    def stamp(self) -> None:
        """Record that the calling thread made progress (a dictionary store: no lock, no frame is read)."""
        ident = threading.get_ident()
        if ident in self._ranks:
            self._stamps[ident] = time.monotonic()

    def _run(self) -> None:
        while True:
            time.sleep(_SAMPLE_INTERVAL_S)
            with self._lock:
                ranks, stamps = dict(self._ranks), dict(self._stamps)
            now = time.monotonic()
            overdue = [(stamp, ident) for ident, stamp in stamps.items() if now - stamp >= self._timeout]
            if overdue:
                stamp, ident = min(overdue)
                self._report(ident, now - stamp, ranks)

    def _report(self, ident: int, still: float, ranks: dict[int, int]) -> None:
        """Report the replica of thread ``ident`` (still for ``still`` s) with every replica's stack; end the worker."""
        rank = ranks[ident]
        frames = sys._current_frames()
        stack = _replica_stack(frames.get(ident))
        own = [f for f in stack if not f.f_code.co_filename.startswith(_STDLIB)] or stack  # skip threading's waits
        where = f"{own[0].f_code.co_filename}:{own[0].f_lineno} in {own[0].f_code.co_name}" if own else "?"
        in_xla = any(f.f_globals.get("__name__", "").startswith("torch_xla") for f in stack)
        message = (
            f"The XLA replica of rank {rank} made no progress for {still:.0f} s"
            f" ({'waiting inside torch_xla; ' if in_xla else ''}stuck at {where})."
            f" {REPLICA_TIMEOUT_VARIABLE}={self._timeout:g} s; set it higher if this step legitimately takes longer."
        )
        sections = []
        for other_ident, other in sorted(ranks.items(), key=lambda item: item[1]):
            if other_ident in frames:
                frames_above_entry = traceback.StackSummary.extract(
                    (f, f.f_lineno) for f in reversed(_replica_stack(frames[other_ident]))
                )
                sections.append(f"Replica of rank {other} is at:\n{''.join(frames_above_entry.format())}")
        try:
            self._channel.report(rank, ReplicaHangError(message, rank), text="\n".join(sections))
        finally:
            os._exit(1)


def _replica_stack(frame: Optional[FrameType]) -> list[FrameType]:
    """The frames of a replica thread above its entry (innermost first)."""
    stack = []
    while frame is not None and frame.f_code is not _run_one_replica.__code__:
        stack.append(frame)
        frame = frame.f_back
    return stack


#: This worker's watch (``None`` in the main process, and when the watch is off).
_watchdog: Optional[_Watchdog] = None


def progress() -> None:
    """Record that the calling replica made progress, for the replica watch (:data:`REPLICA_TIMEOUT_VARIABLE`).

    The multi-device strategies call it on every batch the Trainer moves, optimizer step and
    collective (:class:`ReportsProgress`); the launchers when a replica's function returns. It does nothing
    where no watch runs.
    """
    if _watchdog is not None:
        _watchdog.stamp()


def _then_progress(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, then :func:`progress`: a replica that returned waits for the others next."""
    result = function(*args, **kwargs)
    progress()
    return result


class ReportsProgress:
    """Mixin of the multi-device strategies: batches, optimizer steps and collectives are progress.

    Each calls :func:`progress` first. ``backward`` is left alone: Fabric takes a strategy that
    overrides it as one that needs ``fabric.backward(loss)``, and would refuse ``loss.backward()``.
    Between two of these, a replica may run for up to the replica timeout before it is reported as
    hung (work of its own in a callback, an XLA compilation or execution included).
    """

    def batch_to_device(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().batch_to_device(*args, **kwargs)  # type: ignore[misc]

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().optimizer_step(*args, **kwargs)  # type: ignore[misc]

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        progress()
        super().barrier(*args, **kwargs)  # type: ignore[misc]

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().broadcast(*args, **kwargs)  # type: ignore[misc]

    def all_gather(self, *args: Any, **kwargs: Any) -> Any:
        progress()
        return super().all_gather(*args, **kwargs)  # type: ignore[misc]


class XLALauncher(_LightningXLALauncher):
    """Launcher of ``lightning.Trainer``'s multi-device XLA strategy (see the module docstring).

    As Lightning's: the result of rank 0, with the trained weights, is returned to the main process.
    Unlike Lightning's, the weights are those of the replica that trained: when a worker drives
    several devices, each thread trains its own copy of the Trainer, and Lightning's launcher would
    send back its own, untrained copy. Only local rank 0 writes the weights file.
    """

    @override
    def launch(self, function: Callable, *args: Any, trainer: Optional[pl.Trainer] = None, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every device; return rank 0's result.

        Raises:
            NotImplementedError: ``trainer.fit`` is called a second time on the same Trainer (as in
                Lightning: build a new Trainer and pass ``fit(ckpt_path=...)``).
            BaseException: what a replica raised, with its traceback chained.
        """
        if self._already_fit and trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            raise NotImplementedError(
                "`trainer.fit()` cannot run twice on one Trainer with the multi-device XLA strategy:"
                " build a new Trainer and resume with `trainer.fit(..., ckpt_path=...)`."
            )
        self._main_pid = os.getpid()
        devices = len(self._strategy.parallel_devices or ())
        worker_output = spawn_replicas(
            self._wrapping_function, (trainer, function, args, kwargs), devices, self._start_method
        )
        if trainer is None:
            return worker_output
        self._already_fit |= trainer.state.fn == TrainerFn.FITTING
        self._recover_results_in_main_process(worker_output, trainer)
        return worker_output.trainer_results

    @override
    def _wrapping_function(  # type: ignore[override]
        self,
        process_idx: int,
        trainer: Optional[pl.Trainer],
        function: Callable,
        args: Any,
        kwargs: Any,
        return_queue: Any,
        channel: Any,
    ) -> None:
        function = partial(_then_progress, function)
        replica = partial(super()._wrapping_function, process_idx, trainer, function, args, kwargs, return_queue)
        run_replica(self._main_pid, channel, replica)

    @override
    def _collect_rank_zero_results(self, trainer: pl.Trainer, results: Any) -> Optional[_WorkerOutput]:
        """Gather what the main process needs from this replica's own Trainer (``trainer``)."""
        strategy: Any = trainer.strategy  # this replica's copy, not the launcher's
        checkpoint_callback = trainer.checkpoint_callback
        best_model_path = getattr(checkpoint_callback, "best_model_path", None) if checkpoint_callback else None
        weights_path = None
        if trainer.state.fn == TrainerFn.FITTING:
            state_dict = strategy.lightning_module_state_dict()  # on every rank: metrics may sync
            weights_path = os.path.join(trainer.default_root_dir, ".temp.ckpt")
            if strategy.local_rank == 0:  # one writer per host (each TPU VM has its own disk)
                strategy.checkpoint_io.save_checkpoint(state_dict, weights_path)
        if strategy.local_rank != 0:
            return None
        return _WorkerOutput(best_model_path, weights_path, trainer.state, results, self.get_extra_results(trainer))


class FabricXLALauncher(_LightningFabricXLALauncher):
    """Launcher of ``lightning.Fabric``'s multi-device XLA strategy (see the module docstring)."""

    @override
    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every device; return rank 0's result.

        Raises:
            BaseException: what a replica raised, with its traceback chained.
        """
        self._main_pid = os.getpid()
        devices = len(self._strategy.parallel_devices or ())
        return spawn_replicas(self._wrapping_function, (function, args, kwargs), devices, self._start_method)

    @override
    def _wrapping_function(  # type: ignore[override]
        self, process_idx: int, function: Callable, args: Any, kwargs: Any, return_queue: Any, channel: Any
    ) -> None:
        function = partial(_then_progress, function)
        replica = partial(super()._wrapping_function, process_idx, function, args, kwargs, return_queue)
        run_replica(self._main_pid, channel, replica)


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
