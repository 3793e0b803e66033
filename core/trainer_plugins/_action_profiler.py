"""Lightning's profiler actions, heard by a listener: the boundaries of the loop, without patching Lightning.

Lightning wraps every hook it calls (``training_step``, each callback's and the module's hooks,
the strategy's hooks), the fetch of each batch (``[_TrainingEpochLoop].train_dataloader_next``),
each training batch (``run_training_batch``) and epoch (``run_training_epoch``) and each
``trainer.save_checkpoint`` (``save_checkpoint``) in ``trainer.profiler.start(action)`` /
``stop(action)``. :class:`ActionProfiler` wraps the trainer's profiler: every call goes on to the
profiler it wraps (also the module Lightning hands its profiler at set-up, ``_lightning_module``),
and each action's start and stop also go to a listener. Wrappers nest (each
keeps the one it wraps in ``inner``): :func:`wrap_innermost_profiler` puts one directly around the trainer's
own profiler, :func:`remove_profiler` takes one out of the chain wherever it is.

Part of the Lightning adapter (a twin serves ``pytorch_lightning``, see ``trainer_plugins._standalone``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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

    Wrapping Lightning's default ``PassThroughProfiler`` (which does nothing at start and stop),
    the listener's methods are called directly: one Python call per boundary. Otherwise (another
    profiler, or another wrapper inside), with ``actions`` given, only those actions reach the
    listener (the others cost a set lookup). Setting :attr:`inner` chooses again.

    Args:
        inner: the profiler the trainer had (Lightning's ``PassThroughProfiler`` by default, or another wrapper).
        listener: told of every action's start (``enter``) and stop (``leave``).
        actions: the action names the listener needs to hear of (``None``: all).
    """

    def __init__(self, inner: Profiler, listener: ActionListener, actions: Optional[frozenset[str]] = None) -> None:
        super().__init__()
        self.listener, self._actions = listener, actions
        self.inner = inner

    @property
    def inner(self) -> Profiler:
        """The profiler this one wraps."""
        return self._inner

    @inner.setter
    def inner(self, profiler: Profiler) -> None:
        self._inner = profiler
        if type(profiler) is PassThroughProfiler:
            self.start, self.stop = self.listener.enter, self.listener.leave  # type: ignore[method-assign]
        else:
            self.__dict__.pop("start", None)
            self.__dict__.pop("stop", None)

    def start(self, action_name: str) -> None:
        if self._actions is None or action_name in self._actions:
            self.listener.enter(action_name)
        self._inner.start(action_name)  # not the property: no Python call more per boundary

    def stop(self, action_name: str) -> None:
        self._inner.stop(action_name)
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

    @property
    def _lightning_module(self) -> Any:
        """The module Lightning gives its profiler when the run sets it up (kept by the wrapped profiler)."""
        return getattr(self.inner, "_lightning_module", None)

    @_lightning_module.setter
    def _lightning_module(self, module: Any) -> None:
        self._inner._lightning_module = module  # type: ignore[attr-defined]  # Lightning sets it on any profiler

    def __getattr__(self, name: str) -> Any:
        if name in ("_inner", "listener", "_actions"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def profiler_chain(profiler: Any) -> Iterator[ActionProfiler]:
    """The :class:`ActionProfiler` wrappers of ``profiler``'s chain, outermost first (``profiler`` itself first)."""
    while isinstance(profiler, ActionProfiler):
        yield profiler
        profiler = profiler.inner


def wrap_innermost_profiler(trainer: Any, make: Callable[[Profiler], ActionProfiler]) -> ActionProfiler:
    """Wrap the trainer's own profiler, inside any :class:`ActionProfiler` already there, with ``make(profiler)``.

    A listener that hears every action (the compile monitor) then sits directly around Lightning's
    ``PassThroughProfiler`` and is called without a wrapper's call in between, and one that hears
    a few actions (the goodput ledger) outside it costs one call and a set lookup per boundary.

    Returns:
        The new wrapper.
    """
    outer, profiler = None, trainer.profiler
    while isinstance(profiler, ActionProfiler):
        outer, profiler = profiler, profiler.inner
    wrapper = make(profiler)
    if outer is None:
        trainer.profiler = wrapper
    else:
        outer.inner = wrapper
    return wrapper


def remove_profiler(trainer: Any, wrapper: ActionProfiler) -> None:
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
