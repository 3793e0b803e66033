"""The run's plugin set in Lightning's checkpoints: which plugin, at which version, supplied each role.

Part of the Lightning adapter (its twin serves ``pytorch_lightning``, see :mod:`trainer_plugins._standalone`):
the Trainer's data connector (:class:`trainer_plugins._lightning.TrainerDataConnector`) gives every
plugin-aware Trainer the checkpoint connector defined here.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

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
    """

    def dump_checkpoint(self, weights_only: bool | None = None) -> dict:
        checkpoint = super().dump_checkpoint(weights_only)
        record = None if weights_only else plugin_set_record(self.trainer)
        if record is not None:
            checkpoint[CHECKPOINT_KEY] = record
        return checkpoint


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
