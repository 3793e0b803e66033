"""The goodput ledger of a ``fit``: where its wall time went, for its loggers, console, checkpoints and run directory.

A backend's strategy keeps one for each ``fit`` (a backend plugin's Trainer strategies, through
a mixin of their own): :func:`start_ledger` and :meth:`GoodputLedger.watch` when the
strategy sets up its environment, :meth:`GoodputLedger.interrupted` from its ``on_exception``,
:meth:`GoodputLedger.finish` at its teardown. The core's checkpoint connector
(``trainer_plugins._lightning_checkpoint``) times the restore and puts the ledger into every
checkpoint under :data:`CHECKPOINT_KEY`. Nothing here names a backend: the backend only passes its
compile-seconds reader.

**The buckets** (``trainer_plugins._goodput_ledger.BUCKETS``), with their boundaries. The clock of an
attempt (``trainer_plugins._goodput_clock``) starts when its process started (Linux; the process
that called ``fit`` when the strategy names it, e.g. the main process of one whose workers run the
loop), or where the previous ledger of the same process ended; elsewhere when the ledger starts.

* **start-up**: from that start to the start of the first training epoch (Lightning's profiler
  action ``run_training_epoch``): the imports, the script's own preparation, the Trainer's set-up
  (the device runtime, moving the model), the ``fit`` hooks before training.
* **productive steps**: from there to the start of the strategy's ``on_train_end`` hook (the end of
  the training loop): the training batches with all their hooks, the optimizer steps, Lightning's
  logging and progress, the epoch hooks (the creation of the loader's iterator at an epoch's start
  too: Lightning profiles no action around it).
* **data waiting**: in the training loop, each batch's fetch from the loader (action
  ``[_TrainingEpochLoop].train_dataloader_next``) and its move to the device (the strategy's
  ``batch_to_device`` hook).
* **validation**: each validation run, the sanity check included: from the module's
  ``on_validation_model_eval`` hook to the end of the strategy's ``on_validation_end`` hook; the
  batches it fetches are validation time.
* **checkpoint save**: each ``trainer.save_checkpoint`` (action ``save_checkpoint``: building the
  checkpoint, the strategy's save and its barrier; with background writes the hand-off only) and
  the checkpoint a strategy writes when a stop signal arrives (:meth:`GoodputLedger.timing`).
* **checkpoint restore**: loading the checkpoint of ``ckpt_path`` and restoring the modules and
  callbacks, then the training state (the checkpoint connector).
* **compilation**: the backend's compile seconds counted during any of the above, taken out of it.
* **teardown**: from the end of the training loop (or the exception that ended the fit:
  :meth:`GoodputLedger.interrupted`) to the end of the strategy's teardown (the model back on the
  host, waiting for a background checkpoint write still in flight).

Intervals nest by rank (``trainer_plugins._goodput_clock.RANKS``): a checkpoint saved during
validation is checkpoint time. Each bucket's seconds are the host's view (the training thread):
a device that runs its graphs asynchronously shows where the host waits for it. The buckets of an
attempt add up to its wall time; lost work and the run's totals are in ``trainer_plugins._goodput_ledger``.

**Where it goes.** At every training epoch's end, the run's figures
(``trainer_plugins._goodput_ledger.metrics``) go to each of the Trainer's loggers
(``logger.log_metrics(..., step=trainer.global_step)``, with ``"epoch"`` as in Lightning's own rows);
nothing is printed: the backend prints what it chooses when ``fit`` ends, from
``trainer_plugins._goodput_ledger.goodput_summary_line`` and ``goodput_table_lines``; every checkpoint
but a weights-only one carries the ledger. Where the Trainer
has a logger or a checkpoint callback and ``default_root_dir`` is a local directory, the record in
``<default_root_dir>/goodput/`` (``trainer_plugins._goodput_record``) is rewritten when the attempt
starts, after each checkpoint save, at each epoch end and when ``fit`` ends, and stamped after
each training step. Only global rank 0 keeps a ledger. A failure to write the record is warned
about once and stops the writes; training goes on.

Part of the Lightning adapter (a twin serves ``pytorch_lightning``, see ``trainer_plugins._standalone``).
"""

from __future__ import annotations

import contextlib
import itertools
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Optional

import fsspec

from trainer_plugins._action_profiler import action_listeners, add_action_listener, remove_action_listener
from trainer_plugins._goodput_clock import RANKS, BucketClock, process_start
from trainer_plugins._goodput_ledger import LedgerFormatError, RunLedger, metrics, resumed
from trainer_plugins._goodput_record import NoLedgerError, StampWriter, read_ledger, record_folder, write_record

#: Checkpoint key under which every checkpoint of a fit with a ledger carries it (``RunLedger.as_dict()``).
CHECKPOINT_KEY = "goodput_ledger"

_FETCH = "[_TrainingEpochLoop].train_dataloader_next"
_BATCH = "run_training_batch"
_EPOCH = "run_training_epoch"
_SAVE = "save_checkpoint"
_VALIDATION = "validation"

_ledgers: weakref.WeakKeyDictionary[Any, GoodputLedger] = weakref.WeakKeyDictionary()
#: (time.monotonic(), compile seconds) where the last ledger of this process ended
_last_end: Optional[tuple[float, float]] = None


def ledger_of(trainer: Any) -> Optional[GoodputLedger]:
    """The ledger of ``trainer``'s running ``fit``, or ``None``."""
    return _ledgers.get(trainer)


def start_ledger(
    trainer: Any, compile_seconds: Optional[Callable[[], float]] = None, process_id: Optional[int] = None
) -> GoodputLedger:
    """Start the goodput ledger of ``trainer``'s ``fit`` (see the module docstring); call it on global rank 0.

    Args:
        trainer: a ``lightning.pytorch.Trainer`` (or ``pytorch_lightning``'s) whose ``fit`` is setting up.
        compile_seconds: the backend's compile seconds so far, in s, a total over the process (e.g.
            torch_xla's ``CompileTime`` metric); ``None``: no compilation bucket.
        process_id: the process whose start is the start-up's start (default: this process).

    Returns:
        The :class:`GoodputLedger`, also found with :func:`ledger_of`.
    """
    return GoodputLedger(trainer, compile_seconds, process_id)


class GoodputLedger:
    """The live ledger of one ``fit`` (its attempt of a run): see the module docstring.

    Made by :func:`start_ledger` (its arguments). The account starts at ``trainer.global_step``.

    Attributes:
        ledger: the run's :class:`~trainer_plugins._goodput_ledger.RunLedger`; its last attempt is this one.
        clock: the attempt's :class:`~trainer_plugins._goodput_clock.BucketClock`.
        folder: the record's folder, or ``None`` when nothing is written.
    """

    def __init__(self, trainer: Any, compile_seconds: Optional[Callable[[], float]], process_id: Optional[int]):
        now, started, compiled = time.monotonic(), process_start(process_id), 0.0
        if _last_end is not None and (started is None or _last_end[0] > started):
            started, compiled = _last_end
        started = now if started is None else started
        self.trainer = trainer
        self.ledger = RunLedger.new(first_step=trainer.global_step)
        self.ledger.current.started_at = time.time() - (now - started)
        self.clock = BucketClock(self.ledger.current.seconds, compile_seconds, started, compiled)
        root = str(trainer.default_root_dir)
        writes = bool(trainer.loggers or trainer.checkpoint_callbacks) and fsspec.utils.get_protocol(root) == "file"
        self.folder: Optional[str] = record_folder(root) if writes else None
        self._stamp: Optional[StampWriter] = None
        self._listening = False
        self._exception: Optional[BaseException] = None
        self._trained = False
        self._starts: dict[str, Callable[[], Any]] = {}
        self._stops: dict[str, Callable[[], Any]] = {}
        self._timings = itertools.count()
        _ledgers[trainer] = self
        self.clock.charge()

    # -- the boundaries ---------------------------------------------------------------------------

    def watch(self) -> None:
        """Hear the trainer's profiler actions from now on (call it from ``setup_environment``: the model is connected).

        Listens before Lightning sets the profiler up (the core's wrapper passes the set-up on), to the
        actions of its boundaries only (:func:`~trainer_plugins._action_profiler.add_action_listener`).
        """
        trainer, clock = self.trainer, self.clock
        strategy, module = type(trainer.strategy).__name__, type(trainer.lightning_module).__name__
        device_move = f"[Strategy]{strategy}.batch_to_device"
        self._starts = {
            _FETCH: lambda: clock.begin("data", _FETCH),
            device_move: lambda: clock.begin("data", device_move),
            _SAVE: lambda: clock.begin("checkpoint_save", _SAVE),
            f"[LightningModule]{module}.on_validation_model_eval": lambda: clock.begin("validation", _VALIDATION),
            _EPOCH: self._training_starts,
            f"[Strategy]{strategy}.on_train_end": self._training_ends,
        }
        self._stops = {
            _FETCH: lambda: clock.end(_FETCH),
            device_move: lambda: clock.end(device_move),
            _SAVE: self._saved,
            f"[Strategy]{strategy}.on_validation_end": lambda: clock.end(_VALIDATION),
            _BATCH: self._step_ended,
            _EPOCH: self._epoch_ended,
        }
        for stale in action_listeners(trainer):
            if isinstance(stale, GoodputLedger):  # left by an earlier fit of this trainer that had no teardown
                remove_action_listener(trainer, stale)
        add_action_listener(trainer, self, frozenset(self._starts) | frozenset(self._stops))
        self._listening = True

    def enter(self, action_name: str) -> None:
        """A profiler action starts (see :class:`~trainer_plugins._action_profiler.ActionProfiler`)."""
        handler = self._starts.get(action_name)
        if handler is not None:
            handler()

    def leave(self, action_name: str) -> None:
        """A profiler action stops."""
        handler = self._stops.get(action_name)
        if handler is not None:
            handler()

    @contextlib.contextmanager
    def timing(self, bucket: str) -> Iterator[None]:
        """Count the time inside the context as ``bucket`` (e.g. ``"checkpoint_restore"``), nested by rank.

        Raises:
            ValueError: ``bucket`` is not one of ``trainer_plugins._goodput_clock.RANKS`` (the buckets of intervals).
        """
        if bucket not in RANKS:
            raise ValueError(f"bucket={bucket!r} is not a bucket of an interval: choose one of {', '.join(RANKS)}.")
        key = f"{bucket}:{next(self._timings)}"
        self.clock.begin(bucket, key)
        try:
            yield
        finally:
            self.clock.end(key)

    def _training_starts(self) -> None:
        if self.clock.base == "startup":
            self.clock.set_base("productive")

    def _training_ends(self) -> None:
        self._trained = True
        self.clock.set_base("teardown")

    def _step_ended(self) -> None:
        self.clock.charge()
        attempt = self.ledger.current
        attempt.last_step = self.trainer.global_step
        if self._stamp is None and self.folder is not None:
            self._stamp = self._guarded(StampWriter, self.folder)
        if self._stamp is not None:
            self._guarded(self._stamp.write, self.ledger.run, attempt.number, attempt.last_step, attempt.seconds)

    def _saved(self) -> None:
        if self.clock.end(_SAVE):
            self._write()

    def _epoch_ended(self) -> None:
        self.clock.charge()
        self.ledger.current.last_step = self.trainer.global_step
        # with the epoch, as Lightning adds it to the metrics it logs itself (_LoggerConnector.log_metrics)
        values = {**metrics(self.ledger), "epoch": self.trainer.current_epoch}
        for logger in self.trainer.loggers:
            logger.log_metrics(values, step=self.trainer.global_step)
        self._write()

    # -- checkpoints ------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The run's ledger now, as plain data, for a checkpoint (``checkpoint[CHECKPOINT_KEY]``)."""
        self.clock.charge()
        self.ledger.current.last_step = self.trainer.global_step
        return self.ledger.as_dict()

    def restored(self, checkpoint: Optional[dict[str, Any]], path: Any) -> None:
        """The fit's checkpoint (``ckpt_path``) is loaded, or there is none: the run is new or continued.

        With a ledger in ``checkpoint`` (:data:`CHECKPOINT_KEY`), this attempt continues that run
        (``trainer_plugins._goodput_ledger.resumed``, with the run directory's record); then the
        record is written.
        """
        attempt = self.ledger.current
        step = int(checkpoint.get("global_step", 0)) if checkpoint else attempt.first_step
        snapshot = None
        if checkpoint and checkpoint.get(CHECKPOINT_KEY) is not None:
            try:
                snapshot = RunLedger.from_dict(checkpoint[CHECKPOINT_KEY])
            except LedgerFormatError as error:
                _warn(f"The goodput ledger in {path} is not used ({error}): this fit starts a new run.")
        if snapshot is not None:
            ledger = resumed(snapshot, self._record(), step, None if path is None else str(path))
            ledger.current.started_at = attempt.started_at
            self.clock.rebind(ledger.current.seconds)
            self.ledger = ledger
        elif checkpoint:
            attempt.first_step = attempt.last_step = step
            attempt.resumed_from = None if path is None else str(path)
        self._write()

    def _record(self) -> Optional[RunLedger]:
        if self.folder is None:
            return None
        try:
            return read_ledger(self.folder)
        except NoLedgerError:
            return None
        except LedgerFormatError as error:
            _warn(f"The goodput record is not used ({error}).")
            return None

    # -- the end ----------------------------------------------------------------------------------

    def interrupted(self, exception: BaseException) -> None:
        """The fit is being interrupted by ``exception`` (a stop signal's, a crash's): the loop is left.

        The intervals left open by the exception end; the time from now on is teardown.
        """
        self._exception = exception
        self.clock.reset("teardown")

    def finish(self) -> RunLedger:
        """End the attempt: its last account and the record; stop hearing the profiler. Prints nothing.

        The backend says what it wants at the run's end (``goodput_summary_line``, ``goodput_table_lines``).

        Returns:
            The run's ledger.
        """
        global _last_end
        now = self.clock.charge()
        attempt = self.ledger.current
        attempt.last_step = self.trainer.global_step
        if self._exception is not None:
            attempt.ended = f"interrupted ({type(self._exception).__name__})"
        else:
            attempt.ended = "finished" if self._trained else "interrupted"
        self._write()
        self._unwatch()
        if self._stamp is not None:
            self._stamp.close()
        _ledgers.pop(self.trainer, None)
        _last_end = (now, self.clock.compiled())
        return self.ledger

    def _unwatch(self) -> None:
        if self._listening:
            remove_action_listener(self.trainer, self)
            self._listening = False

    def _write(self) -> None:
        if self.folder is not None:
            self._guarded(write_record, self.folder, self.ledger)

    def _guarded(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``; on an ``OSError``, one warning, and the record is no longer written."""
        try:
            return function(*args)
        except OSError as error:
            _warn(f"The goodput record in {self.folder} is no longer written: {error!r}. Training goes on.")
            self.folder = None
            if self._stamp is not None:
                self._stamp.close()
            self._stamp = None
            return None


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=3)
