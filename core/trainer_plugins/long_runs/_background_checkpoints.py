"""Strategy mixins: a backend's Trainer and Fabric strategies write checkpoints atomically, in the background.

The default writer is the core's :class:`~trainer_plugins.long_runs._checkpoint_io.BackgroundCheckpointIO`
around :class:`~trainer_plugins.long_runs._checkpoint_io.AtomicCheckpointIO`; a backend gives its own
default by overriding ``_default_checkpoint_io`` (a writer that copies on its device, say).
"""

from __future__ import annotations

from typing import Any, Optional

from lightning.pytorch.trainer.states import TrainerStatus

from trainer_plugins.long_runs._checkpoint_io import BackgroundCheckpointIO


class _BackgroundWritesByDefault:
    """Give the strategy :meth:`_default_checkpoint_io` when it was given no checkpoint IO.

    Lightning's strategies default to ``torch.save`` on the calling thread (``TorchCheckpointIO`` or
    a backend's subclass of it), not atomic; with this mixin the default writes atomically in the
    background (:class:`~trainer_plugins.long_runs._checkpoint_io.BackgroundCheckpointIO`, or what
    the backend's override gives). A checkpoint IO given to the strategy or through
    ``plugins=[...]`` wins. The setter keeps the rule of the Lightning strategy below (some accept
    only their backend's checkpoint IO, or a wrapping plugin).

    Raises:
        ValueError: a bad setting of the backend's default writer, when the checkpoint IO is first
            used and at the latest in ``setup_environment`` (before the first step).
    """

    _checkpoint_io: Optional[Any]

    @staticmethod
    def _default_checkpoint_io() -> Any:
        """The checkpoint IO of a strategy given none: the core's background writer (a backend may override it)."""
        return BackgroundCheckpointIO()

    def setup_environment(self) -> None:
        self.checkpoint_io  # noqa: B018 - a bad setting is reported before the first step
        super().setup_environment()  # type: ignore[misc]

    @property
    def checkpoint_io(self) -> Any:
        if self._checkpoint_io is None:
            self._checkpoint_io = self._default_checkpoint_io()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: Optional[Any]) -> None:
        super(_BackgroundWritesByDefault, type(self)).checkpoint_io.fset(self, io)  # type: ignore[misc]

    def wait_for_checkpoint_writes(self) -> None:
        """Wait for this process's checkpoint write in flight, if its checkpoint IO writes in the background.

        Raises:
            BaseException: what the write raised.
        """
        wait = getattr(self.checkpoint_io, "wait", None)
        if callable(wait):
            wait()


class WritesCheckpointsInBackground(_BackgroundWritesByDefault):
    """The Trainer's: background writes by default (:class:`_BackgroundWritesByDefault`); a save outside loops waits.

    A save made while no Trainer loop runs (``trainer.save_checkpoint`` after ``fit``, or a strategy
    used on its own) waits for its write: nothing runs meanwhile, and the caller may read the file
    next. A save inside a loop returns after the copy to the host; Lightning tears the checkpoint IO
    down at the end of ``fit``/``validate``/``test``/``predict``, which waits for the last write.
    Under an engine that reads every checkpoint as soon as it is saved (Ray Train: its
    ``RayTrainReportCallback`` saves into a folder and hands the folder to ``ray.train.report`` on the
    next line), every save waits (:func:`engine_reads_each_save`).
    """

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        super().save_checkpoint(*args, **kwargs)  # type: ignore[misc]
        self._wait_unless_a_loop_runs()

    def _wait_unless_a_loop_runs(self) -> None:
        module = getattr(self, "lightning_module", None)
        trainer = getattr(module, "_trainer", None)
        if (
            trainer is None
            or trainer.state.status != TrainerStatus.RUNNING
            or engine_reads_each_save(getattr(self, "cluster_environment", None))
        ):
            self.wait_for_checkpoint_writes()


#: Packages whose cluster environments belong to engines that read each checkpoint right after the save.
ENGINES_READING_EACH_SAVE = ("ray.train",)


def engine_reads_each_save(environment: Optional[Any]) -> bool:
    """Whether ``environment`` (a Lightning cluster environment, or ``None``) is an engine's that reads each save.

    Ray Train's ``RayLightningEnvironment`` (package ``ray.train``): its report callback passes the
    checkpoint's folder to ``ray.train.report``, which copies it at once. Told by the class's module,
    so that nothing imports Ray.
    """
    module = type(environment).__module__ if environment is not None else ""
    return any(module == package or module.startswith(package + ".") for package in ENGINES_READING_EACH_SAVE)


class FabricWritesCheckpointsInBackground(_BackgroundWritesByDefault):
    """Fabric's: ``fabric.save`` returns after the copy to the host (see :class:`_BackgroundWritesByDefault`).

    ``fabric.load`` waits for the write in flight first, on every rank: global rank 0 (the writer)
    finishes its write, then all ranks meet in a barrier before any reads, since every rank may read
    what rank 0 wrote. A later ``fabric.save`` waits for the earlier write (one in flight); the end
    of a worker process and the interpreter's normal exit wait for the last one
    (:func:`~trainer_plugins.long_runs._checkpoint_io.finish_pending_writes`). A file read by other means right
    after ``fabric.save`` needs ``fabric.strategy.wait_for_checkpoint_writes()`` first.
    """

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        self.wait_for_checkpoints_of_every_rank()
        return super().load_checkpoint(*args, **kwargs)  # type: ignore[misc]

    def wait_for_checkpoints_of_every_rank(self) -> None:
        """Wait for this process's write in flight, then, with several ranks, for every rank (a barrier)."""
        self.wait_for_checkpoint_writes()
        if getattr(self, "world_size", 1) > 1:
            self.barrier("trainer_plugins.checkpoint_written")  # type: ignore[attr-defined]
