"""Lightning's profiler actions, heard by listeners: the boundaries of the loop, without patching Lightning.

Lightning wraps every hook it calls (``training_step``, each callback's and the module's hooks,
the strategy's hooks), the fetch of each batch (``[_TrainingEpochLoop].train_dataloader_next``),
each training batch (``run_training_batch``) and epoch (``run_training_epoch``) and each
``trainer.save_checkpoint`` (``save_checkpoint``) in ``trainer.profiler.start(action)`` /
``stop(action)``. :func:`add_action_listener` wraps the trainer's profiler once in an
:class:`ActionProfiler`: every call goes on to the profiler it wraps (the user's, or Lightning's
default ``PassThroughProfiler``), and each action's start and stop also go to every listener added.
Listeners come and go on that one wrapper (:func:`remove_action_listener`); when the last one goes,
the trainer gets its own profiler back.

One wrapper, not one per listener: Lightning's ``Profiler.__del__`` tears its profiler down
(``AdvancedProfiler`` clears its statistics, ``PyTorchProfiler`` deletes its recordings), and a
wrapper's teardown is its wrapped profiler's. A wrapper dropped before Lightning's
``profiler.describe()`` (a listener leaving at a callback's ``teardown`` hook) emptied the user's
report. :class:`ActionProfiler` owns nothing, so its ``__del__`` tears nothing down; the wrapped
profiler is torn down by Lightning's ``describe()``, as without listeners.

Part of the Lightning adapter (a twin serves ``pytorch_lightning``, see ``trainer_plugins._standalone``).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from lightning.pytorch.profilers import PassThroughProfiler, Profiler


class ActionListener(Protocol):
    """What an :class:`ActionProfiler` tells of each profiler action."""

    def enter(self, action_name: str) -> None:
        """The profiler action ``action_name`` starts."""

    def leave(self, action_name: str) -> None:
        """The profiler action ``action_name`` stops."""


class ActionProfiler(Profiler):
    """The trainer's profiler, wrapped: every call goes on to ``inner``; action boundaries also go to the listeners.

    At an action's start, the listeners hear it in the order they were added, then ``inner``
    starts it; at its stop, ``inner`` stops it, then the listeners hear it in the reverse order (so
    the wrapped profiler's own timings leave the listeners' work at their own boundaries out).
    A listener added with ``actions`` hears only those action names (the others cost a set lookup).
    Actions named with a listener's ``own_prefix`` (a listener that is also a callback: its own
    hooks) are not passed on to ``inner``, so that the user's report holds the actions it holds
    without the listeners.

    With one listener that hears every action around Lightning's ``PassThroughProfiler`` (which
    does nothing at start and stop), the listener's methods are called directly: one Python call
    per boundary, as the default profiler's own.

    Made by :func:`add_action_listener`; use that and :func:`remove_action_listener`.

    Args:
        inner: the profiler the trainer had (Lightning's ``PassThroughProfiler`` by default).
    """

    def __init__(self, inner: Profiler) -> None:
        # no Profiler.__init__: its attributes (dirpath, filename, the stage) are read from ``inner``
        self.inner = inner
        self._listeners: list[tuple[ActionListener, Optional[frozenset[str]], str]] = []
        #: the listeners' own actions started and not stopped, which ``inner`` was not told of (their
        #: stops are not passed on either, also after their listener left in them: its ``teardown`` hook)
        self._hidden: set[str] = set()
        self._bind()

    @property
    def listeners(self) -> tuple[ActionListener, ...]:
        """The listeners, in the order they were added."""
        return tuple(listener for listener, _, _ in self._listeners)

    def add(self, listener: ActionListener, actions: Optional[frozenset[str]] = None, own_prefix: str = "") -> None:
        """Tell ``listener`` of the actions named in ``actions`` (``None``: all), ``inner`` not of ``own_prefix``'s.

        Adding a listener again replaces its ``actions`` and ``own_prefix``.
        """
        self.remove(listener)
        self._listeners.append((listener, actions, own_prefix))
        self._bind()

    def remove(self, listener: ActionListener) -> None:
        """Stop telling ``listener`` (nothing if it is not a listener)."""
        self._listeners = [entry for entry in self._listeners if entry[0] is not listener]
        self._bind()

    def _bind(self) -> None:
        """Choose the calls of a boundary for the listeners and the wrapped profiler now set."""
        self.__dict__.pop("start", None)
        self.__dict__.pop("stop", None)
        self._silent_inner = type(self.inner) is PassThroughProfiler
        self._enters = tuple((listener, actions) for listener, actions, _ in self._listeners)
        self._leaves = self._enters[::-1]
        #: prefixes of the listeners' own actions (``str.startswith`` of an empty tuple is False)
        self._own = tuple(prefix for _, _, prefix in self._listeners if prefix)
        if self._silent_inner and len(self._enters) == 1 and self._enters[0][1] is None:
            listener = self._enters[0][0]
            self.start, self.stop = listener.enter, listener.leave  # type: ignore[method-assign]

    def start(self, action_name: str) -> None:
        for listener, actions in self._enters:
            if actions is None or action_name in actions:
                listener.enter(action_name)
        if self._silent_inner:
            return
        if action_name.startswith(self._own):
            self._hidden.add(action_name)
        else:
            self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        if self._hidden and action_name in self._hidden:
            self._hidden.discard(action_name)
        elif not self._silent_inner:
            self.inner.stop(action_name)
        for listener, actions in self._leaves:
            if actions is None or action_name in actions:
                listener.leave(action_name)

    def summary(self) -> str:
        return self.inner.summary()

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self.inner.setup(*args, **kwargs)

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self.inner.teardown(*args, **kwargs)

    def describe(self) -> None:
        self.inner.describe()

    def __del__(self) -> None:
        """Nothing: the wrapper owns nothing; the wrapped profiler outlives it (Lightning's ``__del__`` tears down)."""

    @property
    def _lightning_module(self) -> Any:
        """The module Lightning gives its profiler when the run sets it up (kept by the wrapped profiler)."""
        return getattr(self.inner, "_lightning_module", None)

    @_lightning_module.setter
    def _lightning_module(self, module: Any) -> None:
        self.inner._lightning_module = module  # type: ignore[attr-defined]  # Lightning sets it on any profiler

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "_listeners", "_hidden", "_enters", "_leaves", "_own", "_silent_inner"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def add_action_listener(
    trainer: Any, listener: ActionListener, actions: Optional[frozenset[str]] = None, own_prefix: str = ""
) -> None:
    """Tell ``listener`` of ``trainer``'s profiler actions from now on (those named in ``actions``; ``None``: all).

    The first listener wraps ``trainer.profiler`` in an :class:`ActionProfiler`; later ones join
    that wrapper. Adding a listener again replaces its ``actions`` and ``own_prefix``.

    Args:
        trainer: a ``lightning.pytorch.Trainer`` (or ``pytorch_lightning``'s).
        listener: an :class:`ActionListener`.
        actions: the action names it needs to hear of, e.g. ``frozenset({"run_training_batch"})``.
        own_prefix: for a listener that is also one of the trainer's callbacks, the start of its hooks'
            action names (Lightning's ``"[Callback]<state_key>."``): the trainer's own profiler is not
            told of them, so its report is the one it gives without the listener (``""``: none).
    """
    wrapper = trainer.profiler
    if not isinstance(wrapper, ActionProfiler):
        wrapper = trainer.profiler = ActionProfiler(wrapper)
    wrapper.add(listener, actions, own_prefix)


def remove_action_listener(trainer: Any, listener: ActionListener) -> None:
    """Stop telling ``listener`` of ``trainer``'s profiler actions (nothing if it was not told).

    When no listener is left, ``trainer.profiler`` is the trainer's own profiler again.
    """
    wrapper = trainer.profiler
    if isinstance(wrapper, ActionProfiler):
        wrapper.remove(listener)
        if not wrapper._listeners:
            trainer.profiler = wrapper.inner


def action_listeners(trainer: Any) -> tuple[ActionListener, ...]:
    """The listeners of ``trainer``'s profiler actions, in the order they were added (empty: none)."""
    wrapper = trainer.profiler
    return wrapper.listeners if isinstance(wrapper, ActionProfiler) else ()
