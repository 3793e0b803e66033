"""Launchers of the multi-device XLA strategy: one worker per device, all stopped on the first failure.

Both flavours (``lightning.Trainer`` and ``lightning.Fabric``) start their workers with
:func:`spawn_replicas` and run each replica inside :func:`run_replica`:

* workers are started by ``torch_xla.distributed.xla_multiprocessing.spawn`` with the ``fork``
  start method, as Lightning's XLA launchers do (guard the entry script with
  ``if __name__ == "__main__":``); a worker process drives one or several devices (threads);
* a replica that raises reports its exception and traceback to the main process and ends its
  worker process at once, its other device threads included; torch_xla's process pool then stops
  the remaining workers, and the main process raises the replica's exception with the worker
  traceback chained as ``__cause__`` (a :class:`WorkerTraceback`). No worker is left running and the
  run never waits in a collective for a replica that died.
"""

from __future__ import annotations

import os
import pickle
import queue
import traceback
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

import torch.multiprocessing as mp
from lightning.fabric.strategies.launchers.xla import _XLALauncher as _LightningFabricXLALauncher
from lightning.pytorch.strategies.launchers.multiprocessing import _WorkerOutput
from lightning.pytorch.strategies.launchers.xla import _XLALauncher as _LightningXLALauncher
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

if TYPE_CHECKING:
    import lightning.pytorch as pl

#: Seconds the main process waits for a failed worker's report once the pool broke.
REPORT_TIMEOUT_S = 5.0


class WorkerTraceback(Exception):
    """The traceback of an exception raised in an XLA worker, chained as ``__cause__`` in the main process."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def spawn_replicas(
    wrapping_function: Callable[..., None], args: tuple[Any, ...], devices: int, start_method: str
) -> Any:
    """Run ``wrapping_function(rank, *args, return_queue, error_queue)`` on every device; return what rank 0 queued.

    Args:
        wrapping_function: a picklable callable (a bound launcher method) that runs one replica
            through :func:`run_replica` and puts local rank 0's result on ``return_queue``.
        args: its arguments after the rank.
        devices: the strategy's number of devices (1 makes torch_xla run in this process).
        start_method: ``"fork"`` (Lightning's choice for XLA).

    Raises:
        BaseException: what a replica raised, with its traceback chained as ``__cause__``; a
            ``RuntimeError`` when a worker died without reporting (a crash or a signal).
    """
    import torch_xla.distributed.xla_multiprocessing as xmp

    spawn_kwargs = {"nprocs": 1} if devices == 1 else {}
    with mp.Manager() as manager:  # torch_xla's process pool pickles its arguments: queue proxies travel
        return_queue, error_queue = manager.Queue(), manager.Queue()
        try:
            xmp.spawn(
                wrapping_function, args=(*args, return_queue, error_queue), start_method=start_method, **spawn_kwargs
            )
        except BrokenProcessPool as broken:
            error, worker_traceback = _reported_failure(error_queue, broken)
            raise error from worker_traceback
        return return_queue.get()


def run_replica(main_pid: int, error_queue: Any, replica: Callable[[], None]) -> None:
    """Run one replica; in a worker process, report a failure and end the worker at once.

    Args:
        main_pid: the process id of the main process (where torch_xla runs a single replica itself).
        error_queue: where to report ``(rank, pickled exception or None, traceback text)``.
        replica: the replica's work.
    """
    try:
        replica()
    except BaseException as error:
        if os.getpid() == main_pid:
            raise
        import torch_xla.runtime as xr

        error_queue.put(_report(xr.global_ordinal(), error))
        os._exit(1)


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
        error_queue: Any,
    ) -> None:
        replica = partial(super()._wrapping_function, process_idx, trainer, function, args, kwargs, return_queue)
        run_replica(self._main_pid, error_queue, replica)

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
        self, process_idx: int, function: Callable, args: Any, kwargs: Any, return_queue: Any, error_queue: Any
    ) -> None:
        replica = partial(super()._wrapping_function, process_idx, function, args, kwargs, return_queue)
        run_replica(self._main_pid, error_queue, replica)


def _report(rank: int, error: BaseException) -> tuple[int, Optional[bytes], str]:
    """(rank, the pickled exception or ``None`` if it cannot be pickled, its formatted traceback)."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        pickled: Optional[bytes] = pickle.dumps(error)
    except Exception:
        pickled = None
    return rank, pickled, text


def _reported_failure(error_queue: Any, broken: BrokenProcessPool) -> tuple[BaseException, Optional[WorkerTraceback]]:
    """The exception a worker reported and its traceback, or an error naming the lost worker."""
    try:
        rank, pickled, text = error_queue.get(timeout=REPORT_TIMEOUT_S)
    except queue.Empty:
        return RuntimeError(f"An XLA worker process died without reporting an exception ({broken})."), None
    try:
        error = pickle.loads(pickled) if pickled is not None else None
    except Exception:  # pickled, but it cannot be rebuilt here (e.g. an __init__ with other arguments)
        error = None
    if not isinstance(error, BaseException):
        error = RuntimeError(f"XLA worker of rank {rank} failed: {text.strip().splitlines()[-1]}")
    return error, WorkerTraceback(f"\n\nXLA worker of rank {rank} raised:\n{text}")
