"""The checkpoint of a run told to stop: written when a signal arrives, found again by ``ckpt_path="last"``.

Lightning's Trainer already stops on SIGTERM: its signal handler sets ``trainer.received_sigterm``
and the training loop raises ``SIGTERMException`` (a ``SystemExit``) once the batch in flight has
run to its end (optimizer step, ``on_train_batch_end``, the progress counters). It writes no
checkpoint. :class:`SavesCheckpointOnStop` adds, for a backend's Trainer strategies:

* the signals named by ``TRAINER_PLUGINS_CHECKPOINT_SIGNALS`` (beside SIGTERM) stop the run the same way;
* with gradient accumulation, the stop takes effect at the end of the accumulation window in flight
  (the batch that steps the optimizer), never inside it: the gradients summed so far live in the
  parameters' ``.grad``, which a checkpoint does not hold, so a stop inside the window would lose
  them. This costs at most ``accumulate_grad_batches - 1`` batches more before the checkpoint;
* when the stop reaches the strategy (``on_exception``), one checkpoint of the whole training state
  is written as Lightning's ``trainer.save_checkpoint`` writes one (its ``dump_checkpoint``, edited by
  :func:`~trainer_plugins.long_runs._interrupted_validation.checkpoint_of_a_stop`, then the strategy's
  ``save_checkpoint``) to :func:`~trainer_plugins.long_runs._stop_checkpoint.checkpoint_path`, first
  under a temporary name, then renamed (``os.replace``), so a half-written file never carries the name;
* one log line names the checkpoint, and the process exits with
  :func:`~trainer_plugins.long_runs._stop_settings.exit_status` (128 + the signal number, as a shell
  reports a process ended by that signal: 143 for SIGTERM);
* if the checkpoint is not written within ``TRAINER_PLUGINS_CHECKPOINT_DEADLINE`` seconds of the
  signal, the process logs that, removes the temporary file and exits at once with the same status;
* a ``fit`` whose training ends normally removes the stop checkpoint of its folder (a later
  "last" would otherwise go back to it).

**Several processes** (DDP, the hosts of a slice): a signal may reach one process only, and every
step holds collectives over all of them, so no process stops on its own signal. At the start of
every training batch the processes take the largest signal number any of them received (``0`` for
none) with one collective, :meth:`SavesCheckpointOnStop._agreed_stop_signal` (by default an
all-reduce of one integer over ``torch.distributed``'s default group, on the strategy's root
device; a backend may supply its own), and all stop after the same batch. Lightning's own SIGTERM
handler is not called there: it broadcasts from inside the handler, at whatever point each process
happens to be. Where :meth:`SavesCheckpointOnStop._stop_needs_agreement` says one process decides
alone, a signal stops it after the batch in flight.

A backend whose replicas run Lightning's loop where Python takes no signal (replica threads) says
so through :meth:`SavesCheckpointOnStop._stops_in_replicas` and decides at batch starts in
:meth:`SavesCheckpointOnStop._stop_at_batch_start`.

Resuming stays Lightning's: :mod:`trainer_plugins.long_runs._stop_checkpoint` shows the checkpoint to
``ckpt_path="last"``; the settings (signals, deadline, ``TRAINER_PLUGINS_RESUME``) are in
:mod:`trainer_plugins.long_runs._stop_settings`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Optional

from lightning.pytorch.utilities.exceptions import SIGTERMException

from trainer_plugins.long_runs._interrupted_validation import checkpoint_of_a_stop
from trainer_plugins.long_runs._stop_checkpoint import (
    InProcessLauncher,
    checkpoint_path,
    move,
    remove,
    resumes_through,
)
from trainer_plugins.long_runs._stop_settings import (
    DEADLINE_VARIABLE,
    checkpoint_signals,
    deadline_s,
    exit_status,
    resume_hint,
    setting,
)

log = logging.getLogger(__name__)


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
            setting(DEADLINE_VARIABLE),
            status,
        )
        os._exit(status)

    def finish(self) -> None:
        self._done.set()
        if self._timer is not None:
            self._timer.cancel()


class SavesCheckpointOnStop:
    """Mixin for a backend's Trainer strategies: a checkpoint of the whole training state when a stop signal arrives.

    See the module docstring for what happens. The signal handlers are installed when training
    starts (Lightning's ``on_train_start`` strategy hook, after Lightning installed its own) and
    removed with Lightning's when the run ends; the checkpoint is written from Lightning's
    ``on_exception`` strategy hook, with the model and optimizers still set up.

    What a backend may supply (methods to override): :meth:`_stop_needs_agreement` and
    :meth:`_agreed_stop_signal` (the "any process stopping?" collective), :meth:`_stops_in_replicas`,
    :meth:`_stop_at_batch_start` and :meth:`_after_stop_checkpoint`.

    Raises:
        ValueError: ``TRAINER_PLUGINS_CHECKPOINT_SIGNALS`` or ``TRAINER_PLUGINS_CHECKPOINT_DEADLINE`` (or
            their aliases) is invalid, when training starts
            (see :mod:`trainer_plugins.long_runs._stop_settings`).
    """

    lightning_module: Any
    _launcher: Any  # Lightning's Strategy: Optional[_Launcher]
    _stop: Optional[_Stop] = None
    _agrees = False  # _stop_needs_agreement(), fixed when training starts (read every batch)

    def _configure_launcher(self) -> None:
        super()._configure_launcher()  # type: ignore[misc]
        if getattr(self, "_launcher", None) is None:
            self._launcher = InProcessLauncher(self)
        else:
            resumes_through(self._launcher)

    def _stop_needs_agreement(self) -> bool:
        """Whether the processes of the run must agree on the stop: ``torch.distributed`` runs with several ranks."""
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)

    def _agreed_stop_signal(self, signum: Optional[int]) -> Optional[int]:
        """The stop signal any process of the run has received (the largest number), or ``None`` if none has.

        A collective: every process calls it at the start of every training batch. By default one
        all-reduce (maximum) of an ``int64`` tensor on the strategy's ``root_device`` over
        :meth:`_stop_agreement_group` (``torch.distributed``'s default group unless a backend says otherwise).

        Args:
            signum: the signal this process received, or ``None``.
        """
        import torch
        import torch.distributed as dist

        value = torch.tensor([int(signum or 0)], dtype=torch.int64, device=self.root_device)  # type: ignore[attr-defined]
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._stop_agreement_group())
        return int(value.item()) or None

    def _stop_agreement_group(self) -> Optional[Any]:
        """The process group of :meth:`_agreed_stop_signal`: ``None`` (the default group) unless a backend overrides it.

        A backend whose default group may lack a backend for its device (a group a launcher made, e.g.
        Ray Train's ``"gloo"``) returns a group of the same ranks that has one.
        """
        return None

    def _stops_in_replicas(self) -> bool:
        """Whether this Trainer runs in a replica that takes no signal and stops at an agreed batch (default: no).

        Called when training starts; a backend returning ``True`` decides in :meth:`_stop_at_batch_start`.
        """
        return False

    def _after_stop_checkpoint(self) -> None:
        """Called on every rank once the stop checkpoint is written and renamed (or failed); nothing by default."""

    def on_train_start(self) -> None:
        super().on_train_start()  # type: ignore[misc]
        signals = checkpoint_signals()
        deadline_s()  # a bad value fails now, not when the signal arrives
        self._stop = _Stop()
        self._agrees = self._stop_needs_agreement()
        if self._stops_in_replicas():
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

        Where the processes agree (several of them) only the request is noted: they agree on the
        batch at the next batch start.
        """
        assert self._stop is not None
        if self._agrees:
            self._stop.start(signum, "every process stops after the batch at which they agree on it")
        elif self._inside_accumulation_window():
            self._stop.start(signum, "the gradient accumulation window in flight finishes")
        else:
            self._stop.received(lightning_handler, signum, frame)

    def on_train_end(self) -> None:
        """Remove the stop checkpoint of this folder: training ended normally, so it describes a superseded state.

        Left in place, ``ckpt_path="last"`` (and ``TRAINER_PLUGINS_RESUME=auto``) would take the next
        run back to that state whenever no newer "last" checkpoint is in sight.
        """
        super().on_train_end()  # type: ignore[misc]
        trainer = self.lightning_module.trainer
        if trainer.is_global_zero:
            remove(checkpoint_path(trainer))

    def on_train_batch_start(self, batch: Any, batch_idx: int, *args: Any) -> None:
        """Set Lightning's stop flag for this batch if a stop is due and the batch ends an accumulation window."""
        super().on_train_batch_start(batch, batch_idx, *args)  # type: ignore[misc]
        if self._stop is not None:
            self._stop_at_batch_start(self._stop)

    def _stop_at_batch_start(self, stop: _Stop) -> None:
        """Set Lightning's stop flag if a stop is due: where the processes agree, once any received a signal
        (:meth:`_agreed_stop_signal`); elsewhere once a signal arrived. Inside an accumulation window the
        flag is cleared (a signal between two batches set it for the next one), so Lightning stops at the
        window's last batch."""
        trainer = self.lightning_module.trainer
        if self._agrees:
            signum = self._agreed_stop_signal(stop.signum)  # every process, every batch
            if signum is None:
                return
            stop.start(signum, "another process was told to stop: this one stops too", announce=False)
        elif stop.signum is None:
            return
        trainer._signal_connector.received_sigterm = not self._inside_accumulation_window()  # Lightning's flag

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)  # type: ignore[misc]
        self.save_on_stop(exception)

    def save_on_stop(self, exception: BaseException) -> None:
        """Write the stop checkpoint if ``exception`` is Lightning's stop after a stop signal; set its exit status.

        Called from Lightning's ``on_exception`` hook, and by a launcher in each replica where Lightning
        calls no ``on_exception`` (replica threads). Every rank takes part.
        """
        if not isinstance(exception, SIGTERMException):
            return
        stop = self._stop = self._stop or _Stop()
        module = self.lightning_module
        if module is None or module._trainer is None:
            return  # a launcher's main process: its replicas wrote the checkpoint
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
            if callable(wait):  # a background writer (Lightning's AsyncCheckpointIO) finishes the file first
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
        self._after_stop_checkpoint()
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
