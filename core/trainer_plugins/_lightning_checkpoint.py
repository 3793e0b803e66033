"""The Trainer's checkpoint connector: the run's plugin set and goodput ledger in every checkpoint, which
checkpoint "last" is, and the restore's time for the goodput ledger.

Part of the Lightning adapter (its twin serves ``pytorch_lightning``, see :mod:`trainer_plugins._standalone`):
the Trainer's data connector (:class:`trainer_plugins._lightning.TrainerDataConnector`) gives every
plugin-aware Trainer the checkpoint connector defined here.
"""

from __future__ import annotations

import contextlib
from typing import Any

from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

from trainer_plugins._goodput import CHECKPOINT_KEY as GOODPUT_KEY
from trainer_plugins._goodput import ledger_of

#: Checkpoint key under which the resolved plugin set is stored (see :class:`PluginSetCheckpointConnector`).
CHECKPOINT_KEY = "trainer_plugins"


def plugin_set_record(trainer: Any) -> dict[str, Any] | None:
    """Which plugin, at which version, supplied each role of ``trainer``'s run (``None``: not plugin-aware).

    Returns:
        ``{"decisions": [Decision as dict, ...], "plugins": [{"name", "distribution", "version", "state"}, ...]}``.
    """
    connector = getattr(trainer._accelerator_connector, "plugin_connector", None)
    if connector is None:
        return None
    records = connector.catalog.manager.records.values()
    return {
        "decisions": connector.explanation.as_dicts(),
        "plugins": [
            {"name": r.name, "distribution": r.distribution, "version": r.version, "state": r.state} for r in records
        ],
    }


class PluginSetCheckpointConnector(_CheckpointConnector):
    """Lightning's checkpoint connector, storing the run's plugin set in every full checkpoint.

    Every ``lightning.Trainer`` built by the plugin-aware connectors gets this class for its
    checkpoint connector (:class:`TrainerDataConnector`). The record sits under
    ``checkpoint["trainer_plugins"]`` (read it back with ``torch.load(path)["trainer_plugins"]``; see
    ``plugin_set_record``), added once Lightning has built the checkpoint, in every checkpoint
    but a weights-only one. It is not a callback: a callback is called on each of Lightning's
    callback hooks, six a training step, and costs Lightning's hook dispatch each time.

    When the ``fit`` has a goodput ledger (``trainer_plugins._goodput``), every checkpoint but a
    weights-only one also carries it, under ``checkpoint["goodput_ledger"]``, and the restore of
    ``ckpt_path`` is timed for it: the file's load with the modules and callbacks, then the
    training state and the release of the loaded checkpoint.
    """

    def dump_checkpoint(self, weights_only: bool | None = None) -> dict:
        checkpoint = super().dump_checkpoint(weights_only)
        record = None if weights_only else plugin_set_record(self.trainer)
        if record is not None:
            checkpoint[CHECKPOINT_KEY] = record
        ledger = None if weights_only else ledger_of(self.trainer)
        if ledger is not None:
            checkpoint[GOODPUT_KEY] = ledger.snapshot()
        return checkpoint

    def _restore_modules_and_callbacks(self, *args: Any, **kwargs: Any) -> None:
        ledger = ledger_of(self.trainer)
        if ledger is None:
            return super()._restore_modules_and_callbacks(*args, **kwargs)
        with ledger.timing("checkpoint_restore"):
            super()._restore_modules_and_callbacks(*args, **kwargs)
        ledger.restored(self._loaded_checkpoint, self._ckpt_path)
        return None

    def restore_training_state(self) -> None:
        ledger = ledger_of(self.trainer)
        with ledger.timing("checkpoint_restore") if ledger is not None else contextlib.nullcontext():
            super().restore_training_state()

    def resume_end(self) -> None:
        ledger = ledger_of(self.trainer)
        with ledger.timing("checkpoint_restore") if ledger is not None else contextlib.nullcontext():
            super().resume_end()

    def _parse_ckpt_path(self, state_fn: Any, ckpt_path: Any, model_provided: bool, model_connected: bool) -> Any:
        """Lightning's ``ckpt_path`` resolution; ``"last"`` takes complete ones only (:func:`last_checkpoint`)."""
        if ckpt_path != "last":
            return super()._parse_ckpt_path(state_fn, ckpt_path, model_provided, model_connected)
        path = last_checkpoint(self.trainer)
        if path is None:
            rank_zero_warn(
                f'.{state_fn.value}(ckpt_path="last") is set, but there is no last checkpoint available.'
                " No checkpoint will be loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`."
            )
        return path


def last_checkpoint(trainer: Any) -> str | None:
    """The checkpoint ``fit(ckpt_path="last")`` resumes from: the newest complete one of Lightning's candidates.

    The candidates are Lightning's: each ``OnExceptionCheckpoint``'s path and each
    ``ModelCheckpoint``'s ``last*.ckpt`` files. Two differences from Lightning 2.6: a candidate
    found in a directory of an fsspec URL keeps its protocol (Lightning's lookup drops it, so
    ``memory://`` or ``gs://`` last checkpoints were never found), and a candidate counts only if
    the strategy's checkpoint IO says it is complete, when that plugin has an ``is_committed(path)``
    method (e.g. one writing a commit marker on an object store, which has no atomic rename);
    otherwise existing is enough, as in Lightning. The newest by modification time wins (a directory's
    own, or where the filesystem keeps none, as object stores keep none for a prefix, its newest file's).
    """
    from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

    candidates = {getattr(cb, "ckpt_path", None) for cb in trainer.callbacks if isinstance(cb, OnExceptionCheckpoint)}
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            fs = callback._fs
            protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
            found = callback._find_last_checkpoints(trainer)
            candidates |= found if protocol in ("file", "local") else {fs.unstrip_protocol(p) for p in found}
    committed = getattr(trainer.strategy.checkpoint_io, "is_committed", None)
    times = {}
    for path in filter(None, candidates):
        fs = get_filesystem(path)
        if fs.exists(path) and (committed is None or committed(path)):
            times[path] = _modified(fs, path)
    return max(times, key=times.__getitem__) if times else None


def _modified(fs: Any, path: str) -> Any:
    """``fs.modified(path)``; for a directory without a time of its own, the newest time of the files under it."""
    try:
        return fs.modified(path)
    except (FileNotFoundError, NotImplementedError):
        if not fs.isdir(path):
            raise
        return max(fs.modified(each) for each in fs.find(path))


class PluginSetCheckpoint(Callback):
    """A callback storing the same record as :class:`PluginSetCheckpointConnector`, from ``on_save_checkpoint``.

    Not added by trainer-plugins any more (the checkpoint connector stores the record); a user who
    adds it gets the record written by Lightning's callback hook too, before the LightningModule's
    own ``on_save_checkpoint`` runs. Nothing is stored when the Trainer does not use the
    plugin-aware connector.
    """

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        record = plugin_set_record(trainer)
        if record is not None:
            checkpoint[CHECKPOINT_KEY] = record
