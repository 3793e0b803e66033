"""The launchers of the multi-device XLA strategy, for ``lightning.Trainer`` and ``lightning.Fabric``.

Both start their workers with :func:`~xla_plugins.strategies.launchers._supervisor.spawn_replicas`
and run each replica inside :func:`~xla_plugins.strategies.launchers._failures.run_replica`; how a
run stops on a failure is told in :mod:`xla_plugins.strategies.launchers`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Optional

import torch.multiprocessing as mp
from lightning.fabric.strategies.launchers.xla import _XLALauncher as _LightningFabricXLALauncher
from lightning.pytorch.strategies.launchers.multiprocessing import _WorkerOutput
from lightning.pytorch.strategies.launchers.xla import _XLALauncher as _LightningXLALauncher
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from trainer_plugins.long_runs import _stop_checkpoint
from xla_plugins.long_runs import _preemption, _stop_agreement
from xla_plugins.strategies.launchers._failures import run_replica
from xla_plugins.strategies.launchers._supervisor import spawn_replicas
from xla_plugins.strategies.launchers._watchdog import _then_progress

if TYPE_CHECKING:
    import lightning.pytorch as pl


class XLALauncher(_LightningXLALauncher):
    """Launcher of ``lightning.Trainer``'s multi-device XLA strategy (see :mod:`xla_plugins.strategies.launchers`).

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
        with (
            _stop_checkpoint.resume_arguments(function, args, kwargs, trainer) as (args, kwargs),
            _stop_agreement.workers_stop_together(mp.get_context(self._start_method)),
        ):
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
        function = partial(_then_progress, partial(_preemption.run_saving_on_stop, function))
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
                strategy.checkpoint_io.teardown()  # the main process reads it: wait for a background write
        if strategy.local_rank != 0:
            return None
        return _WorkerOutput(best_model_path, weights_path, trainer.state, results, self.get_extra_results(trainer))


class FabricXLALauncher(_LightningFabricXLALauncher):
    """Launcher of ``lightning.Fabric``'s multi-device XLA strategy (see :mod:`xla_plugins.strategies.launchers`)."""

    @override
    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every device; return rank 0's result.

        A stop signal to the main process or to a worker is handled as
        :mod:`~xla_plugins.long_runs._fabric_preemption` says (through
        :func:`~xla_plugins.long_runs._stop_agreement.workers_stop_together`).

        Raises:
            BaseException: what a replica raised, with its traceback chained.
            SystemExit: after a stop signal, with 128 + its number (143 for SIGTERM).
        """
        self._main_pid = os.getpid()
        devices = len(self._strategy.parallel_devices or ())
        # stop signals: the replicas agree when they read fabric.strategy.received_sigterm (_fabric_preemption)
        with _stop_agreement.workers_stop_together(mp.get_context(self._start_method), ends_unless_read=True):
            return spawn_replicas(self._wrapping_function, (function, args, kwargs), devices, self._start_method)

    @override
    def _wrapping_function(  # type: ignore[override]
        self, process_idx: int, function: Callable, args: Any, kwargs: Any, return_queue: Any, channel: Any
    ) -> None:
        function = partial(_then_progress, partial(_then_finish_monitors, function))
        replica = partial(super()._wrapping_function, process_idx, function, args, kwargs, return_queue)
        run_replica(self._main_pid, channel, replica)


def _then_finish_monitors(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, then the summary of the Fabric compile monitors of this replica."""
    from xla_plugins.compilation import fabric_steps

    result = function(*args, **kwargs)
    fabric_steps.finish_this_thread()
    return result
