"""Where the checkpoint of a stopped run lives, and how Lightning's ``ckpt_path="last"`` finds it again.

Resuming stays Lightning's: :class:`StopCheckpointCandidate` is a Lightning ``OnExceptionCheckpoint``
naming :func:`checkpoint_path`, put among the Trainer's callbacks for the one ``fit`` that asks for
``ckpt_path="last"`` (:func:`resume_arguments`), so Lightning's own choice of the newest "last"
checkpoint sees it, whatever ``ModelCheckpoint`` the user has (or none). :class:`InProcessLauncher`
is where that happens for the strategies that run in the calling process (Lightning calls a
strategy's launcher before it chooses the checkpoint); :func:`resumes_through` makes Lightning's
DDP launcher (``_SubprocessScriptLauncher``, in every process) do the same, and a backend's own
launcher may call :func:`resume_arguments` itself. :func:`move` and :func:`remove` put a written checkpoint in place.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, Optional

from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from trainer_plugins.long_runs import _commits
from trainer_plugins.long_runs._stop_settings import FILENAME, RESUME_VARIABLE, resume_mode, setting

log = logging.getLogger(__name__)


def checkpoint_path(trainer: Any) -> str:
    """Where the stop checkpoint of ``trainer`` goes: ``<trainer.default_root_dir>/checkpoints/last-stopped.ckpt``.

    The file name is :data:`~trainer_plugins.long_runs._stop_settings.FILENAME`.

    ``default_root_dir`` (the working directory unless given) is the same for every rerun of a
    script, unlike a logger's ``version_N`` folder, which is new for each run.
    """
    return os.path.join(str(trainer.default_root_dir), "checkpoints", FILENAME)


def exists(path: str) -> bool:
    return bool(get_filesystem(path).exists(path))


def move(source: str, target: str) -> None:
    """Give ``source`` (a file, or the directory of a sharded checkpoint) the name ``target``, replacing an earlier one.

    On a local disk by a rename (:func:`trainer_plugins.long_runs._commits.commit_local`: atomic, a directory too).
    Elsewhere (an object store: no atomic rename) the filesystem's ``mv`` moves it, then its commit
    marker ``<target>.commit`` is written (:func:`trainer_plugins.long_runs._commits.commit_remote`):
    ``ckpt_path="last"`` takes it only once committed.
    """
    if isinstance(get_filesystem(target), LocalFileSystem):
        _commits.commit_local(source, target)
        return
    _commits.commit_remote(source, target)
    remove(source)  # the marker the atomic write left beside the temporary name


def remove(path: str) -> None:
    """Remove the file or directory ``path`` and its commit marker, those that exist."""
    with contextlib.suppress(OSError, FileNotFoundError):
        _commits.remove(path)


class StopCheckpointCandidate(OnExceptionCheckpoint):
    """Lightning's ``OnExceptionCheckpoint`` naming the stop checkpoint, so that ``ckpt_path="last"`` considers it.

    Lightning's checkpoint connector chooses, for ``ckpt_path="last"``, the newest existing file among
    every ``OnExceptionCheckpoint.ckpt_path`` and every ``ModelCheckpoint``'s ``last*.ckpt``. This one
    writes nothing itself (:class:`~trainer_plugins.long_runs._preemption.SavesCheckpointOnStop` does, on
    the stop signal only).
    """

    def __init__(self, trainer: Any) -> None:
        path = checkpoint_path(trainer)
        super().__init__(os.path.dirname(path), os.path.splitext(os.path.basename(path))[0])

    def on_exception(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: only a stop signal writes the checkpoint."""

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the checkpoint stays (Lightning's ``OnExceptionCheckpoint`` removes its own here)."""


def _resolve_resume(function: Callable, args: tuple, kwargs: dict, trainer: Any) -> tuple[tuple, dict, bool]:
    """The arguments of ``trainer.fit``'s inner function with ``ckpt_path`` resolved as the module says.

    Returns ``(args, kwargs, consider)``: ``consider`` says whether the stop checkpoint must be among
    Lightning's "last" candidates.
    """
    mode = resume_mode()  # checked for every trainer function: a bad value fails at once
    if getattr(function, "__name__", None) != "_fit_impl":
        return args, kwargs, False
    bound = inspect.signature(function).bind(*args, **kwargs)
    ckpt_path = bound.arguments.get("ckpt_path")
    if ckpt_path is None and mode == "auto" and exists(checkpoint_path(trainer)):
        bound.arguments["ckpt_path"] = "last"
        log.info(
            "%s=auto: resuming from the last checkpoint (a stopped run left %s).",
            setting(RESUME_VARIABLE),
            checkpoint_path(trainer),
        )
        return bound.args, bound.kwargs, True
    return args, kwargs, ckpt_path == "last"


@contextlib.contextmanager
def resume_arguments(function: Callable, args: tuple, kwargs: dict, trainer: Any) -> Iterator[tuple[tuple, dict]]:
    """The arguments for ``function``, a Trainer entry point, with the stop checkpoint among the "last" ones.

    Inside the context, ``trainer``'s callbacks hold a :class:`StopCheckpointCandidate` when the
    ``fit`` asks for ``ckpt_path="last"`` (given, or set by ``TRAINER_PLUGINS_RESUME=auto``).

    Raises:
        ValueError: ``TRAINER_PLUGINS_RESUME`` (or an alias of it) is invalid.
    """
    if trainer is None:
        yield args, kwargs
        return
    args, kwargs, consider = _resolve_resume(function, args, kwargs, trainer)
    if not consider:
        yield args, kwargs
        return
    candidate = StopCheckpointCandidate(trainer)
    trainer.callbacks.append(candidate)
    try:
        yield args, kwargs
    finally:
        trainer.callbacks.remove(candidate)


class InProcessLauncher(_Launcher):
    """Launcher of the Trainer strategies that run in the calling process (a single device, one process per host).

    Runs the Trainer function here, as Lightning does for a strategy without launcher, through
    :func:`resume_arguments`.
    """

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy

    @property
    def is_interactive_compatible(self) -> bool:
        """``True``: nothing is started, so notebooks work."""
        return True

    def launch(self, function: Callable, *args: Any, trainer: Optional[Any] = None, **kwargs: Any) -> Any:
        with resume_arguments(function, args, kwargs, trainer) as (args, kwargs):
            return function(*args, **kwargs)

    def kill(self, signum: Any) -> None:
        """Nothing: there is no other process."""


def resumes_through(launcher: Any) -> None:
    """Make Lightning's DDP launcher (``_SubprocessScriptLauncher``) run its function through :func:`resume_arguments`.

    Lightning's DDP runs the Trainer function in every process through that launcher's ``launch``;
    the instance's ``launch`` is wrapped (the class stays Lightning's, which Lightning's own checks
    test for). Other launchers are left as they are: a backend's own launcher resolves the stop
    checkpoint itself, or not at all.
    """
    if not isinstance(launcher, _SubprocessScriptLauncher) or getattr(launcher, "_resumes_stop_checkpoint", False):
        return
    launch = launcher.launch

    def launch_considering_the_stop_checkpoint(
        function: Callable, *args: Any, trainer: Optional[Any] = None, **kwargs: Any
    ) -> Any:
        with resume_arguments(function, args, kwargs, trainer) as (args, kwargs):
            return launch(function, *args, trainer=trainer, **kwargs)

    launcher.launch = launch_considering_the_stop_checkpoint  # type: ignore[method-assign]
    launcher._resumes_stop_checkpoint = True  # type: ignore[attr-defined]
