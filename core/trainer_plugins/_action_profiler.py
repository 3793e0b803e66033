"""Lightning's profiler actions, heard by a listener: the boundaries of the loop, without patching Lightning.

Lightning wraps every hook it calls (``training_step``, each callback's and the module's hooks,
the strategy's hooks), the fetch of each batch (``[_TrainingEpochLoop].train_dataloader_next``),
each training batch (``run_training_batch``) and epoch (``run_training_epoch``) and each
``trainer.save_checkpoint`` (``save_checkpoint``) in ``trainer.profiler.start(action)`` /
``stop(action)``. :class:`ActionProfiler` wraps the trainer's profiler: every call goes on to the
profiler it wraps, and each action's start and stop also go to a listener. Wrappers nest (each
keeps the one it wraps in ``inner``); :func:`remove` takes one out of the chain wherever it is.

Part of the Lightning adapter (a twin serves ``pytorch_lightning``, see ``trainer_plugins._standalone``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional, Protocol

from lightning.pytorch.profilers import PassThroughProfiler, Profiler


class ActionListener(Protocol):
    """What an :class:`ActionProfiler` tells of each profiler action."""

    def enter(self, action_name: str) -> None:
        """The profiler action ``action_name`` starts."""

    def leave(self, action_name: str) -> None:
        """The profiler action ``action_name`` stops."""


class ActionProfiler(Profiler):
    """The trainer's profiler, wrapped: every call goes on to ``inner``; action boundaries also go to ``listener``.

    With Lightning's default ``PassThroughProfiler`` (which does nothing at start and stop) the
    listener's methods are called directly: one Python call per boundary. Otherwise, with
    ``actions`` given, only those actions reach the listener (the others cost a set lookup).

    Args:
        inner: the profiler the trainer had (Lightning's ``PassThroughProfiler`` by default, or another wrapper).
        listener: told of every action's start (``enter``) and stop (``leave``).
        actions: the action names the listener needs to hear of (``None``: all).
    """

    def __init__(self, inner: Profiler, listener: ActionListener, actions: Optional[frozenset[str]] = None) -> None:
        super().__init__()
        self.inner, self.listener = inner, listener
        self._actions = actions
        if type(inner) is PassThroughProfiler:
            self.start, self.stop = listener.enter, listener.leave  # type: ignore[method-assign]

    def start(self, action_name: str) -> None:
        if self._actions is None or action_name in self._actions:
            self.listener.enter(action_name)
        self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        self.inner.stop(action_name)
        if self._actions is None or action_name in self._actions:
            self.listener.leave(action_name)

    def summary(self) -> str:
        return self.inner.summary()

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self.inner.setup(*args, **kwargs)

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self.inner.teardown(*args, **kwargs)

    def describe(self) -> None:
        self.inner.describe()

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "listener", "_actions"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def chain(profiler: Any) -> Iterator[ActionProfiler]:
    """The :class:`ActionProfiler` wrappers of ``profiler``'s chain, outermost first (``profiler`` itself first)."""
    while isinstance(profiler, ActionProfiler):
        yield profiler
        profiler = profiler.inner


def remove(trainer: Any, wrapper: ActionProfiler) -> None:
    """Take ``wrapper`` out of ``trainer.profiler``'s chain of :class:`ActionProfiler` objects (if it is there).

    The wrapper outside it then calls the one inside directly.
    """
    if trainer.profiler is wrapper:
        trainer.profiler = wrapper.inner
        return
    outer = trainer.profiler
    while isinstance(outer, ActionProfiler):
        if outer.inner is wrapper:
            outer.inner = wrapper.inner
            return
        outer = outer.inner
