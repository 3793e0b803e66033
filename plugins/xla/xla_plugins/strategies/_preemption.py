"""The checkpoint of a run told to stop: written when a signal arrives, found again by ``ckpt_path="last"``.

Lightning's Trainer already stops on SIGTERM: its signal handler sets ``trainer.received_sigterm``
and the training loop raises ``SIGTERMException`` (a ``SystemExit``) once the batch in flight has
run to its end (optimizer step, ``on_train_batch_end``, the progress counters). It writes no
checkpoint. :class:`SavesCheckpointOnStop` adds, for the Trainer's XLA strategies:

* the signals named by ``XLA_PLUGINS_CHECKPOINT_SIGNALS`` (beside SIGTERM) stop the run the same way;
* with gradient accumulation, the stop takes effect at the end of the accumulation window in flight
  (the batch that steps the optimizer), never inside it: the gradients summed so far live in the
  parameters' ``.grad`` (in the spawn strategy, each replica's own, until the step reduces them),
  which a checkpoint does not hold, so a stop inside the window would lose them. This costs at
  most ``accumulate_grad_batches - 1`` batches more before the checkpoint;
* when the stop reaches the strategy (``on_exception``), one checkpoint of the whole training state
  is written as Lightning's ``trainer.save_checkpoint`` writes one (its ``dump_checkpoint``, edited by
  :func:`~xla_plugins.strategies._interrupted_validation.checkpoint_of_a_stop`, then the strategy's
  ``save_checkpoint``) to
  :func:`~xla_plugins.strategies._stop_checkpoint.checkpoint_path`, first under a temporary name,
  then renamed (``os.replace``), so a half-written file never carries the name;
* one log line names the checkpoint, and the process exits with
  :func:`~xla_plugins.strategies._stop_settings.exit_status` (128 + the signal number, as a shell
  reports a process ended by that signal: 143 for SIGTERM);
* if the checkpoint is not written within ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` seconds of the
  signal, the process logs that, removes the temporary file and exits at once with the same status;
* a ``fit`` whose training ends normally removes the stop checkpoint of its folder (a later
  "last" would otherwise go back to it).

The spawn strategy (``"xla"``, one worker process per device, or one replica thread per device)
runs Lightning's loop in replica threads, where Python takes no signal and Lightning installs no
handler, and calls no ``on_exception`` there. Its replicas agree instead
(:mod:`~xla_plugins.strategies._stop_agreement`): a signal to the main process or to any worker
fixes the batch after which all replicas of the host stop (up to ``STOP_MARGIN_BATCHES`` after the
one in flight), each replica sets Lightning's stop flag when it starts that batch (or the first batch
after it that ends an accumulation window), and the launcher
writes the checkpoint from every replica (:func:`run_saving_on_stop`). The hosts of a slice under
the SPMD strategies agree over their process group instead, and the spawn strategy's replicas on
several hosts over their worker processes' group
(:mod:`~xla_plugins.strategies._stop_agreement`).

Resuming stays Lightning's: :mod:`xla_plugins.strategies._stop_checkpoint` shows the checkpoint to
``ckpt_path="last"``; the settings (signals, deadline, ``XLA_PLUGINS_RESUME``) are in
:mod:`xla_plugins.strategies._stop_settings`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Optional

from lightning.pytorch.utilities.exceptions import SIGTERMException

from xla_plugins._logging import log
from xla_plugins.strategies import _stop_agreement
from xla_plugins.strategies._interrupted_validation import checkpoint_of_a_stop
from xla_plugins.strategies._stop_agreement import agreed_signal, several_hosts
from xla_plugins.strategies._stop_checkpoint import InProcessLauncher, checkpoint_path, move, remove
from xla_plugins.strategies._stop_settings import (
    DEADLINE_VARIABLE,
    checkpoint_signals,
    deadline_s,
    exit_status,
    resume_hint,
)


class _Stop:
    """One stop request: the signal, and the deadline by which its checkpoint must be written."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.partial_path: Optional[str] = None
        self._timer: Optional[threading.Timer] = None
        self._done = threading.Event()

    def start(self, signum: int, what: str = "the step in flight finishes", announce: bool = True) -> None:
        """Note the first stop signal ``signum`` and start the deadline (later calls change nothing)."""
        if self.signum is not None:
            return
        self.signum = signum
        seconds = deadline_s()
        if announce:
            log.warning(
                "Received %s: %s, then a checkpoint is written (deadline %g s).",
                signal.Signals(signum).name,
                what,
                seconds,
            )
        self._timer = threading.Timer(seconds, self._give_up, args=(seconds,))
        self._timer.daemon = True
        self._timer.start()

    def received(self, lightning_handler: Any, signum: int, frame: Any) -> None:
        """Signal handler: :meth:`start`, then Lightning's SIGTERM handler, which stops the loop."""
        self.start(signum)
        if callable(lightning_handler):
            lightning_handler(signum, frame)

    def _give_up(self, seconds: float) -> None:
        if self._done.is_set():
            return
        if self.partial_path is not None:
            remove(self.partial_path)
        assert self.signum is not None
        status = exit_status(self.signum)
        log.error(
            "Stopped by %s: no checkpoint was written within %g s (%s); earlier checkpoints are unchanged."
            " Exiting with status %d.",
            signal.Signals(self.signum).name,
            seconds,
            DEADLINE_VARIABLE,
            status,
        )
        os._exit(status)

    def finish(self) -> None:
        self._done.set()
        if self._timer is not None:
            self._timer.cancel()


class SavesCheckpointOnStop:
    """Mixin for the Trainer's XLA strategies: a checkpoint of the whole training state when a stop signal arrives.

    See the module docstring for what happens. The signal handlers are installed when training
    starts (Lightning's ``on_train_start`` strategy hook, after Lightning installed its own) and
    removed with Lightning's when the run ends; the checkpoint is written from Lightning's
    ``on_exception`` strategy hook, with the model and optimizers still set up.

    Raises:
        ValueError: ``XLA_PLUGINS_CHECKPOINT_SIGNALS`` or ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` is invalid (when
            training starts; see :mod:`xla_plugins.strategies._stop_settings`).
    """

    lightning_module: Any
    _launcher: Any  # Lightning's Strategy: Optional[_Launcher]
    _stop: Optional[_Stop] = None
    _batches = 0
    _several_hosts = False  # several_hosts(self), fixed when training starts (read every batch)
    _spawn_hosts: Optional[_stop_agreement.WorkerGroup] = None  # a spawn replica leading its process on several hosts
    _spawn_spans_hosts = False  # a spawn replica on several hosts

    def _configure_launcher(self) -> None:
        super()._configure_launcher()  # type: ignore[misc]
        if getattr(self, "_launcher", None) is None:
            self._launcher = InProcessLauncher(self)

    def on_train_start(self) -> None:
        super().on_train_start()  # type: ignore[misc]
        signals = checkpoint_signals()
        deadline_s()  # a bad value fails now, not when the signal arrives
        self._stop = _Stop()
        self._batches = 0
        self._several_hosts = several_hosts(self)
        if _stop_agreement.host_stop is not None:  # a replica of the spawn strategy: they agree at batch starts
            self._spawn_spans_hosts = self.num_nodes > 1  # type: ignore[attr-defined]
            if self._spawn_spans_hosts:
                _stop_agreement.host_stop.spans_hosts()
                self._spawn_hosts = _stop_agreement.spawn_hosts()
            return
        if threading.current_thread() is not threading.main_thread():
            return  # Python takes signals on the main thread only; Lightning's handler stays
        lightning_handler = signal.getsignal(signal.SIGTERM)
        for signum in signals:
            signal.signal(signum, partial(self._received, lightning_handler))

    def _inside_accumulation_window(self) -> bool:
        """Whether the batch in flight (or, between batches, the last one) does not step the optimizer."""
        return bool(self.lightning_module.trainer.fit_loop.epoch_loop._should_accumulate())

    def _received(self, lightning_handler: Any, signum: int, frame: Any) -> None:
        """Signal handler: stop after the batch in flight, or, inside an accumulation window, after the window.

        On several hosts only the request is noted: the hosts agree on the batch at the next batch start.
        """
        assert self._stop is not None
        if self._several_hosts:
            self._stop.start(signum, "every host stops after the batch at which the hosts agree on it")
        elif self._inside_accumulation_window():
            self._stop.start(signum, "the gradient accumulation window in flight finishes")
        else:
            self._stop.received(lightning_handler, signum, frame)

    def on_train_end(self) -> None:
        """Remove the stop checkpoint of this folder: training ended normally, so it describes a superseded state.

        Left in place, ``ckpt_path="last"`` (and ``XLA_PLUGINS_RESUME=auto``) would take the next
        run back to that state whenever no newer "last" checkpoint is in sight.
        """
        super().on_train_end()  # type: ignore[misc]
        trainer = self.lightning_module.trainer
        if trainer.is_global_zero:
            remove(checkpoint_path(trainer))

    def on_train_batch_start(self, batch: Any, batch_idx: int, *args: Any) -> None:
        """Set Lightning's stop flag for this batch if a stop is due and the batch ends an accumulation window.

        In a replica of the spawn strategy a stop is due from the agreed batch on
        (:class:`~xla_plugins.strategies._stop_agreement.HostStop`; on several hosts the one the
        hosts agreed on);
        on several hosts once any host received a signal (:mod:`~xla_plugins.strategies._stop_agreement`);
        elsewhere once a signal arrived. Inside a window the flag is cleared (a signal between two
        batches set it for the next one), so Lightning stops at the window's last batch.
        """
        super().on_train_batch_start(batch, batch_idx, *args)  # type: ignore[misc]
        stop = self._stop
        if stop is not None and self._several_hosts and _stop_agreement.host_stop is None:
            signum = agreed_signal(self, stop.signum)  # every host, every batch (_stop_agreement)
            if signum is None:
                return
            trainer = self.lightning_module.trainer
            stop.start(signum, "another host was told to stop: this one stops too", announce=False)
            trainer._signal_connector.received_sigterm = not self._inside_accumulation_window()  # Lightning's flag
            return
        if stop is None or (_stop_agreement.host_stop is None and stop.signum is None):
            return
        trainer = self.lightning_module.trainer
        if _stop_agreement.host_stop is None:
            trainer._signal_connector.received_sigterm = not self._inside_accumulation_window()  # Lightning's flag
            return
        self._batches += 1
        signum = _stop_agreement.host_stop.batch_started(self._batches, self._spawn_hosts, self._spawn_spans_hosts)
        if signum is not None and not self._inside_accumulation_window():
            stop.start(signum, f"the replicas stop after batch {self._batches}", announce=trainer.is_global_zero)
            trainer._signal_connector.received_sigterm = True  # Lightning's stop flag

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)  # type: ignore[misc]
        self.save_on_stop(exception)

    def save_on_stop(self, exception: BaseException) -> None:
        """Write the stop checkpoint if ``exception`` is Lightning's stop after a stop signal; set its exit status.

        Called from Lightning's ``on_exception`` hook, and by the spawn strategy's launcher in each
        replica (where Lightning calls no ``on_exception``). Every replica takes part.
        """
        if not isinstance(exception, SIGTERMException):
            return
        stop = self._stop = self._stop or _Stop()
        module = self.lightning_module
        if module is None or module._trainer is None:
            return  # the spawn strategy's main process: its replicas wrote the checkpoint
        trainer = module.trainer
        if stop.signum is None:
            if not trainer.received_sigterm:
                return
            stop.signum = signal.SIGTERM  # seen by Lightning's handler alone, before training started
        path = checkpoint_path(trainer)
        status = exit_status(stop.signum)
        name = signal.Signals(stop.signum).name
        stop.partial_path = path + ".partial"
        started = time.monotonic()
        try:
            # trainer.save_checkpoint, with the loop progress made exact to resume from (checkpoint_of_a_stop)
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            checkpoint_of_a_stop(checkpoint, trainer)
            trainer.strategy.save_checkpoint(checkpoint, stop.partial_path)
            trainer.strategy.barrier("Trainer.save_checkpoint")
            wait = getattr(trainer.strategy.checkpoint_io, "wait", None)
            if callable(wait):  # a background writer (xla_plugins.checkpoint_io) finishes the file first
                wait()
            if trainer.is_global_zero:
                move(stop.partial_path, path)
        except Exception as error:
            stop.finish()
            remove(stop.partial_path)
            log.error(
                "Stopped by %s: the checkpoint could not be written (%r). Exiting with status %d.", name, error, status
            )
        else:
            stop.finish()
            if trainer.is_global_zero:
                log.warning(
                    "Stopped by %s at global step %d: checkpoint %s written in %.1f s. %s Exiting with status %d.",
                    name,
                    trainer.global_step,
                    path,
                    time.monotonic() - started,
                    resume_hint(),
                    status,
                )
        if _stop_agreement.host_stop is not None:
            self.barrier("stop checkpoint renamed")  # type: ignore[attr-defined]  # no replica leaves before
        exception.code = status  # type: ignore[attr-defined]  # SystemExit's status, re-raised by Lightning
        exception.args = (status,)  # the status a copy rebuilt from a worker's report carries


def run_saving_on_stop(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` (``trainer._fit_impl`` and the like, in a replica); on Lightning's stop, the
    stop checkpoint of the function's Trainer (:meth:`SavesCheckpointOnStop.save_on_stop`) before it propagates."""
    try:
        return function(*args, **kwargs)
    except SIGTERMException as exception:
        strategy = getattr(getattr(function, "__self__", None), "strategy", None)
        if isinstance(strategy, SavesCheckpointOnStop):
            strategy.save_on_stop(exception)
        raise
