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

A listener names the actions it needs (a set of names, or a test asked once per name): the wrapper
works out, the first time it sees an action name, which listeners hear it, and from then on calls
only those. Lightning profiles many hooks that do nothing: each callback's hooks that its class
does not override, the module's and the strategy's empty default hooks (:func:`runs_empty_hook`);
a listener that counts what happens inside hooks leaves those out and costs nothing there.

One wrapper, not one per listener: Lightning's ``Profiler.__del__`` tears its profiler down
(``AdvancedProfiler`` clears its statistics, ``PyTorchProfiler`` deletes its recordings), and a
wrapper's teardown is its wrapped profiler's. A wrapper dropped before Lightning's
``profiler.describe()`` (a listener leaving at a callback's ``teardown`` hook) emptied the user's
report. :class:`ActionProfiler` owns nothing, so its ``__del__`` tears nothing down; the wrapped
profiler is torn down by Lightning's ``describe()``, as without listeners.

Part of the Lightning adapter (a twin serves ``pytorch_lightning``, see ``trainer_plugins._standalone``).
"""

from __future__ import annotations

import dis
from collections.abc import Callable
from typing import Any, Protocol, Union

from lightning.pytorch.profilers import PassThroughProfiler, Profiler


class ActionListener(Protocol):
    """What an :class:`ActionProfiler` tells of each profiler action."""

    def enter(self, action_name: str) -> None:
        """The profiler action ``action_name`` starts."""

    def leave(self, action_name: str) -> None:
        """The profiler action ``action_name`` stops."""


#: What a listener hears: every action (``None``), the actions named in a set, or those a test accepts.
Actions = Union[None, frozenset, Callable[[str], bool]]
#: Who hears an action: the enter methods of its listeners, their leave methods in reverse, whether ``inner`` does.
Route = tuple[tuple[Callable[[str], None], ...], tuple[Callable[[str], None], ...], bool]

#: The owners of Lightning's hook actions, by the prefix of the action's name (``[Callback]<state_key>.<hook>``,
#: ``[LightningModule]<class>.<hook>``, ...): the trainer's attribute holding them.
_HOOK_OWNERS = {
    "[Callback]": "callbacks",
    "[LightningModule]": "lightning_module",
    "[LightningDataModule]": "datamodule",
    "[Strategy]": "strategy",
}


def _empty(function: Any) -> bool:
    """Whether ``function`` (a function or bound method) is a Python function that does nothing.

    Its code only returns ``None`` (a body of ``pass``, ``...`` or a docstring) or one of its
    arguments as it came (``return batch``, as ``ModelHooks.on_before_batch_transfer``), for every
    supported Python (``LOAD_CONST None`` or ``LOAD_FAST <argument>``, then ``RETURN_VALUE``;
    ``RETURN_CONST None`` from 3.12). Anything else (a decorator's wrapper, a builtin, a callable
    object) is not empty.
    """
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is None:
        return False
    arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    ops = [(op.opname, op.argval) for op in dis.get_instructions(code) if op.opname not in ("RESUME", "NOP", "CACHE")]
    if ops == [("RETURN_CONST", None)]:
        return True
    return (
        len(ops) == 2
        and ops[1][0] == "RETURN_VALUE"
        and (ops[0] == ("LOAD_CONST", None) or (ops[0][0] == "LOAD_FAST" and ops[0][1] in arguments))
    )


def runs_empty_hook(trainer: Any, action_name: str) -> bool:
    """Whether Lightning's profiler action ``action_name`` of ``trainer`` runs only hooks whose body is empty.

    Lightning profiles each hook it calls as ``[Callback]<state_key>.<hook>`` (for every callback,
    whether its class overrides the hook or not), ``[LightningModule]<class>.<hook>``,
    ``[LightningDataModule]<class>.<hook>`` and ``[Strategy]<class>.<hook>``
    (``lightning.pytorch.trainer.call``), and inside the action calls only that hook. Most of
    ``Callback``'s and ``ModelHooks``' hooks are empty (``pass``, or ``return batch``): an action that
    runs no other code runs no tensor operation, no read and no compilation. ``False`` for any other
    action (the loop's own, ``run_training_batch``, a batch's fetch), a hook not found, or one with code.

    Args:
        trainer: a ``lightning.pytorch.Trainer`` (or ``pytorch_lightning``'s) in its run.
        action_name: the profiler action's name.
    """
    prefix = next((p for p in _HOOK_OWNERS if action_name.startswith(p)), None)
    if prefix is None:
        return False
    owner_name, _, hook = action_name[len(prefix) :].rpartition(".")
    held = getattr(trainer, _HOOK_OWNERS[prefix], None)
    if prefix == "[Callback]":
        owners = [callback for callback in held or () if callback.state_key == owner_name]
    else:
        owners = [held] if held is not None and type(held).__name__ == owner_name else []
    return bool(owners) and all(_empty(getattr(owner, hook, None)) for owner in owners)


class ActionProfiler(Profiler):
    """The trainer's profiler, wrapped: every call goes on to ``inner``; action boundaries also go to the listeners.

    At an action's start, the listeners hear it in the order they were added, then ``inner``
    starts it; at its stop, ``inner`` stops it, then the listeners hear it in the reverse order (so
    the wrapped profiler's own timings leave the listeners' work at their own boundaries out).
    A listener added with ``actions`` hears only the action names in it, or those it accepts when
    ``actions`` is a test (asked once per name); which listeners hear an action is worked out the
    first time its name comes (a dict lookup after that), and one that no listener hears costs
    nothing more. Actions named with a listener's ``own_prefix`` (a listener that is also a callback: its own
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
        self._listeners: list[tuple[ActionListener, Actions, str]] = []
        #: action name -> who hears it (:data:`Route`), worked out the first time the name comes
        self._routes: dict[str, Route] = {}
        #: the listeners' own actions started and not stopped, which ``inner`` was not told of (their
        #: stops are not passed on either, also after their listener left in them: its ``teardown`` hook)
        self._hidden: set[str] = set()
        self._bind()

    @property
    def listeners(self) -> tuple[ActionListener, ...]:
        """The listeners, in the order they were added."""
        return tuple(listener for listener, _, _ in self._listeners)

    def add(self, listener: ActionListener, actions: Actions = None, own_prefix: str = "") -> None:
        """Tell ``listener`` of the actions that ``actions`` names or accepts (all: ``None``), not ``inner`` of its own.

        ``own_prefix`` starts the names of the listener's own actions. Adding a listener again replaces its
        ``actions`` and ``own_prefix``.
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
        self._routes = {}
        self._silent_inner = type(self.inner) is PassThroughProfiler
        #: prefixes of the listeners' own actions (``str.startswith`` of an empty tuple is False)
        self._own = tuple(prefix for _, _, prefix in self._listeners if prefix)
        if self._silent_inner and len(self._listeners) == 1 and self._listeners[0][1] is None:
            listener = self._listeners[0][0]
            self.start, self.stop = listener.enter, listener.leave  # type: ignore[method-assign]

    def _route(self, action_name: str) -> Route:
        """Who hears ``action_name``: the enter and leave methods of its listeners, and whether ``inner`` does."""
        hearing = [
            listener
            for listener, actions, _ in self._listeners
            if actions is None or (action_name in actions if isinstance(actions, frozenset) else actions(action_name))
        ]
        route = (
            tuple(listener.enter for listener in hearing),
            tuple(listener.leave for listener in reversed(hearing)),
            not self._silent_inner and not action_name.startswith(self._own),
        )
        self._routes[action_name] = route
        return route

    def start(self, action_name: str) -> None:
        route = self._routes.get(action_name) or self._route(action_name)
        for enter in route[0]:
            enter(action_name)
        if route[2]:
            self.inner.start(action_name)
        elif not self._silent_inner:  # a listener's own action: its stop is not passed on either
            self._hidden.add(action_name)

    def stop(self, action_name: str) -> None:
        route = self._routes.get(action_name) or self._route(action_name)
        if self._hidden and action_name in self._hidden:
            self._hidden.discard(action_name)
        elif not self._silent_inner:
            self.inner.stop(action_name)
        for leave in route[1]:
            leave(action_name)

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
        if name in ("inner", "_listeners", "_hidden", "_routes", "_own", "_silent_inner"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def add_action_listener(trainer: Any, listener: ActionListener, actions: Actions = None, own_prefix: str = "") -> None:
    """Tell ``listener`` of ``trainer``'s profiler actions from now on (those ``actions`` names or accepts, or all).

    The first listener wraps ``trainer.profiler`` in an :class:`ActionProfiler`; later ones join
    that wrapper. Adding a listener again replaces its ``actions`` and ``own_prefix``.

    Args:
        trainer: a ``lightning.pytorch.Trainer`` (or ``pytorch_lightning``'s).
        listener: an :class:`ActionListener`.
        actions: the action names it needs to hear of, e.g. ``frozenset({"run_training_batch"})``, or a
            test of an action's name (``Callable[[str], bool]``), asked once per name while the
            listeners stay the same (e.g. leaving out :func:`runs_empty_hook`'s actions).
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
