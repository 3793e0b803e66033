"""What the stop checkpoint says about the loop, and a correction to Lightning's restart, so a resume is exact.

Lightning (2.5 and 2.6, ``lightning.pytorch.loops``) stops on SIGTERM between two validation
batches (``_EvaluationLoop._evaluation_step``), and its loops restart from what their progress
counters say. Three cases go wrong as they stand:

* **a stop during the fit's validation.** The checkpoint shows the validation loop with every
  started batch completed, which Lightning's training epoch loop reads as "saved after the
  validation" (``RESTARTED_ON_LAST``): the resumed fit skips the rest of that validation (and,
  when the rerun has no validation, trains one batch more than the epoch has, 17 steps of 16
  measured; :mod:`trainer_plugins.long_runs._loader_position` ends such an epoch instead).
  :func:`checkpoint_of_a_stop` writes the validation as restarting from its first batch
  (``RESTARTED_MID_EVALUATION`` with nothing done), so the resumed fit runs that whole validation
  again, then continues training; its results and callbacks (``ModelCheckpoint(monitor=...)``,
  ``EarlyStopping``) see a full validation, as in the uninterrupted run.
* **a restarted validation's totals.** Lightning sets back the validation's current counters on a
  restart but not its totals, so the interrupted batch counts twice as started; a checkpoint
  written later in that epoch would read as mid-validation again. :class:`CorrectsRestarts` sets
  the totals back too.
* **a stop before any training batch finished** (during the sanity check, say): a restarting
  loop skips the sanity check and misreads counters at zero. :func:`checkpoint_of_a_stop` leaves
  the loop progress out (Lightning then restores the model, optimizers and callbacks only), so
  the resumed fit runs from its first batch, with its sanity check, as the interrupted one did.
"""

from __future__ import annotations

from typing import Any


def checkpoint_of_a_stop(checkpoint: dict[str, Any], trainer: Any) -> None:
    """Edit ``checkpoint`` (Lightning's ``dump_checkpoint`` of ``trainer``, stopped now) so its resume is exact.

    See the module docstring: a stop during the fit's validation restarts that validation from its
    first batch; a stop before the fit trained any batch keeps no loop progress. Other checkpoints
    are left as they are.
    """
    loops = checkpoint.get("loops")
    if loops is None or "fit_loop" not in loops:
        return
    fit = loops["fit_loop"]
    if fit["epoch_loop.batch_progress"]["total"]["completed"] == 0:
        del checkpoint["loops"]
        return
    if not trainer.validating or trainer.sanity_checking:
        return
    progress = fit["epoch_loop.val_loop.batch_progress"]
    before = progress["total"]["completed"] - progress["current"]["completed"]  # earlier validations of the epoch
    progress["total"].update(ready=before + 1, started=before + 1, processed=before, completed=before)
    progress["current"].update(ready=1, started=1, processed=0, completed=0)
    progress["is_last_batch"] = False


class CorrectsRestarts:
    """Mixin for a backend's Trainer strategies: a restarted validation's totals (see the module docstring)."""

    lightning_module: Any

    def on_validation_start(self) -> None:
        """A validation restarted mid-run counts its batches as Lightning's current counters do."""
        super().on_validation_start()  # type: ignore[misc]
        trainer = self.lightning_module.trainer
        val_loop = trainer.fit_loop.epoch_loop.val_loop
        if trainer.state.fn == "fit" and not trainer.sanity_checking and val_loop.restarting:
            total = val_loop.batch_progress.total
            total.ready = total.started = total.processed = total.completed
