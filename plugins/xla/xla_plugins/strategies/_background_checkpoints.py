"""Strategy mixin: the Trainer's XLA strategies write checkpoints atomically, in the background by default."""

from __future__ import annotations

from typing import Any, Optional

from lightning.pytorch.trainer.states import TrainerStatus

from xla_plugins.checkpoint_io import default_checkpoint_io


class WritesCheckpointsInBackground:
    """Give the strategy :func:`~xla_plugins.checkpoint_io.default_checkpoint_io` when it was given no checkpoint IO.

    Lightning's XLA strategies default to ``XLACheckpointIO`` (``torch.save`` on the training
    thread, not atomic); with this mixin the default is
    :class:`~xla_plugins.checkpoint_io.BackgroundXLACheckpointIO` (or, with
    ``XLA_PLUGINS_CHECKPOINT_WRITES=sync``, :class:`~xla_plugins.checkpoint_io.AtomicXLACheckpointIO`).
    A save made while no Trainer loop runs (``trainer.save_checkpoint`` after ``fit``, or a strategy
    used on its own) waits for its write: nothing runs meanwhile, and the caller may read the file
    next. A checkpoint IO given to the strategy or through ``Trainer(plugins=...)`` wins. The setter keeps
    the rule of the Lightning strategy below (the XLA strategies accept ``XLACheckpointIO`` or a
    wrapping plugin only).

    Raises:
        ValueError: a bad ``XLA_PLUGINS_CHECKPOINT_WRITES``, when the checkpoint IO is first used and at
            the latest in ``setup_environment`` (before the first step).
    """

    _checkpoint_io: Optional[Any]

    @staticmethod
    def _default_checkpoint_io() -> Any:
        return default_checkpoint_io()

    def setup_environment(self) -> None:
        self.checkpoint_io  # noqa: B018 - a bad setting is reported before the first step
        super().setup_environment()  # type: ignore[misc]

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        super().save_checkpoint(*args, **kwargs)  # type: ignore[misc]
        module = getattr(self, "lightning_module", None)
        trainer = getattr(module, "_trainer", None)
        if trainer is None or trainer.state.status != TrainerStatus.RUNNING:
            wait = getattr(self.checkpoint_io, "wait", None)
            if callable(wait):
                wait()

    @property
    def checkpoint_io(self) -> Any:
        if self._checkpoint_io is None:
            self._checkpoint_io = self._default_checkpoint_io()
        return super().checkpoint_io  # type: ignore[misc]

    @checkpoint_io.setter
    def checkpoint_io(self, io: Optional[Any]) -> None:
        super(WritesCheckpointsInBackground, type(self)).checkpoint_io.fset(self, io)  # type: ignore[misc]
