"""Strategy mixins: the Trainer's and Fabric's XLA strategies write checkpoints atomically, in the background.

The core's mixins (:mod:`trainer_plugins.long_runs._background_checkpoints`) with the XLA default:
:func:`~xla_plugins.checkpoints.checkpoint_io.default_checkpoint_io`, that is
:class:`~xla_plugins.checkpoints.checkpoint_io.BackgroundXLACheckpointIO` (or, with
``XLA_PLUGINS_CHECKPOINT_WRITES=sync``, :class:`~xla_plugins.checkpoints.checkpoint_io.AtomicXLACheckpointIO`),
where Lightning's XLA strategies default to ``XLACheckpointIO`` (``torch.save`` on the calling
thread, not atomic).
"""

from __future__ import annotations

from typing import Any

from trainer_plugins.long_runs import _background_checkpoints
from xla_plugins.checkpoints.checkpoint_io import default_checkpoint_io


class _XLADefault:
    """The XLA strategies' default checkpoint IO (a bad ``XLA_PLUGINS_CHECKPOINT_WRITES`` raises ``ValueError``)."""

    @staticmethod
    def _default_checkpoint_io() -> Any:
        return default_checkpoint_io()


class WritesCheckpointsInBackground(_XLADefault, _background_checkpoints.WritesCheckpointsInBackground):
    """The core's Trainer mixin with the XLA default writer."""


class FabricWritesCheckpointsInBackground(_XLADefault, _background_checkpoints.FabricWritesCheckpointsInBackground):
    """The core's Fabric mixin with the XLA default writer."""
