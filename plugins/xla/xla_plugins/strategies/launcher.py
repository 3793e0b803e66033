"""The launcher of the multi-device XLA strategy: one worker per device, all stopped on the first failure."""

from __future__ import annotations

import os
import pickle
import queue
import traceback
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch.multiprocessing as mp
from lightning.pytorch.strategies.launchers.multiprocessing import _WorkerOutput
from lightning.pytorch.strategies.launchers.xla import _XLALauncher as _LightningXLALauncher
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

if TYPE_CHECKING:
    import lightning.pytorch as pl


class WorkerTraceback(Exception):
    """The traceback of an exception raised in an XLA worker, chained as ``__cause__`` in the main process."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class XLALauncher(_LightningXLALauncher):
    """Runs a function on every XLA device through ``torch_xla.distributed.xla_multiprocessing.spawn``.

    As Lightning's XLA launcher: workers are forked (``start_method="fork"``), each device runs its
    replica (threads when a worker drives several devices), and the result of rank 0, with the
    trained weights, is returned to the main process. The entry script must be guarded by
    ``if __name__ == "__main__":``.

    On top, failures end the run instead of hanging it: a replica that raises reports its exception
    and traceback to the main process and ends its worker process at once (its other device threads
    included); torch_xla's process pool then stops the remaining workers, and :meth:`launch` raises
    the replica's exception in the main process with the worker traceback as ``__cause__``. Only
    local rank 0 writes the temporary weights file the main process reads back.
    """

    @override
    def launch(self, function: Callable, *args: Any, trainer: Optional[pl.Trainer] = None, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every device; return rank 0's result.

        Raises:
            NotImplementedError: ``trainer.fit`` is called a second time on the same Trainer (as in
                Lightning: build a new Trainer and pass ``fit(ckpt_path=...)``).
            BaseException: whatever a replica raised, with its traceback chained.
        """
        if self._already_fit and trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            raise NotImplementedError(
                "`trainer.fit()` cannot run twice on one Trainer with the multi-device XLA strategy:"
                " build a new Trainer and resume with `trainer.fit(..., ckpt_path=...)`."
            )
        import torch_xla.distributed.xla_multiprocessing as xmp

        self._main_pid = os.getpid()
        spawn_kwargs = {"nprocs": 1} if self._strategy.num_processes == 1 else {}
        with mp.Manager() as manager:  # torch_xla's process pool pickles its arguments: proxies travel
            return_queue, error_queue = manager.Queue(), manager.Queue()
            try:
                xmp.spawn(
                    self._wrapping_function,
                    args=(trainer, function, args, kwargs, return_queue, error_queue),
                    start_method=self._start_method,
                    **spawn_kwargs,
                )
            except BrokenProcessPool as broken:
                error, worker_traceback = _reported_failure(error_queue, broken)
                raise error from worker_traceback
            worker_output = return_queue.get()
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
        try:
            super()._wrapping_function(process_idx, trainer, function, args, kwargs, return_queue)
        except BaseException as error:
            if os.getpid() == self._main_pid:  # torch_xla ran the replica in this process (one device)
                raise
            error_queue.put(_report(process_idx, error))
            os._exit(1)

    @override
    def _collect_rank_zero_results(self, trainer: pl.Trainer, results: Any) -> Optional[_WorkerOutput]:
        """Gather what the main process needs; only local rank 0 writes the weights file."""
        checkpoint_callback = trainer.checkpoint_callback
        best_model_path = getattr(checkpoint_callback, "best_model_path", None) if checkpoint_callback else None
        weights_path = None
        if trainer.state.fn == TrainerFn.FITTING:
            state_dict = self._strategy.lightning_module_state_dict()  # on every rank: metrics may sync
            weights_path = os.path.join(trainer.default_root_dir, ".temp.ckpt")
            if self._strategy.local_rank == 0:  # one writer per host (each TPU VM has its own disk)
                self._strategy.checkpoint_io.save_checkpoint(state_dict, weights_path)
        if self._strategy.local_rank != 0:
            return None
        return _WorkerOutput(best_model_path, weights_path, trainer.state, results, self.get_extra_results(trainer))


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
        rank, pickled, text = error_queue.get(timeout=5)
    except queue.Empty:
        return RuntimeError(f"An XLA worker process died without reporting an exception ({broken})."), None
    error = pickle.loads(pickled) if pickled is not None else RuntimeError(f"XLA worker of rank {rank} failed")
    return error, WorkerTraceback(f"\n\nXLA worker of rank {rank} raised:\n{text}")
