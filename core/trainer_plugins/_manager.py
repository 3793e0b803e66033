"""The plugin manager: entry-point discovery, controls, the API handshake, quarantine and the guard.

Layering (imports point downward only): ``_hookspecs``, ``_entries`` and ``_controls`` below, this
module above them, ``_catalog`` and the connector above it. Layers above learn of a reset through
:func:`on_reset` callbacks.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import SimpleNamespace
from typing import Any, Optional

import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from trainer_plugins import _hookspecs
from trainer_plugins._controls import PREFIX as CONTROL_PREFIX
from trainer_plugins._controls import PROBE_TIMEOUT_VARIABLE, Controls, on_change
from trainer_plugins._entries import APIS, ENTRY_TYPES, ROLE_BASES
from trainer_plugins._standalone import package_of, resolve_in

log = logging.getLogger("trainer_plugins")

#: Entry-point group a plugin distribution registers its hook module under.
ENTRY_POINT_GROUP = "trainer_plugins"
#: Name of the built-in plugin that describes Lightning's own accelerators and strategies.
BUILTIN_PLUGIN = "lightning"
#: Exceptions a decision hook raises to reject the user's configuration; passed on unchanged.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, NotImplementedError, ModuleNotFoundError)


class PluginWarning(UserWarning):
    """Warning category for plugins that were quarantined or lost a name conflict."""


class PluginError(RuntimeError):
    """A plugin failed: it could not be imported, a hook or a class of it raised, or its API version does not match.

    The message names the plugin, its distribution and version and the original exception, which
    is also chained as ``__cause__``.

    Attributes:
        plugin: the :class:`PluginRecord` of the plugin at fault (``None`` if unknown).
        error: the original exception (``None`` if there was none).
    """

    plugin: Optional[PluginRecord] = None
    error: Optional[BaseException] = None


@dataclass
class PluginRecord:
    """What the manager knows about one plugin.

    Attributes:
        name: the plugin name (its entry-point name; ``"lightning"`` for the built-in plugin).
        value: what the entry point points at (``"package.module"``).
        distribution: the distribution that ships it (``None`` when registered from code).
        version: that distribution's version.
        state: ``"loaded"``, ``"quarantined"`` or ``"blocked"``.
        reason: why it is in that state (empty when loaded).
        error: the exception that quarantined it, if any.
        api: the ``TRAINER_PLUGINS_API`` specifier it declared.
        plugin: the plugin object (the module the entry point names).
        hooks: the guarded hook functions registered with pluggy in its place (``None`` until registered).
        output: what the plugin printed to stdout while importing or declaring (captured, never printed).
        environ_changes: variable -> (value before, value after) for each ``os.environ`` change made
            while importing it.
        unavailable: why its availability probe failed in the latest run that asked ('' if it did not).
    """

    name: str
    value: str
    distribution: Optional[str] = None
    version: Optional[str] = None
    state: str = "loaded"
    reason: str = ""
    error: Optional[BaseException] = None
    api: Optional[str] = None
    plugin: Any = field(default=None, repr=False, compare=False)
    hooks: Any = field(default=None, repr=False, compare=False)
    output: str = ""
    environ_changes: dict[str, tuple[Optional[str], Optional[str]]] = field(default_factory=dict)
    unavailable: str = ""
    pending: Optional[threading.Thread] = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``"name (distribution version)"`` for messages."""
        if self.distribution is None:
            return self.name
        return f"{self.name} ({self.distribution} {self.version})"


@dataclass
class Run:
    """What the plugins said during one run (one ``Trainer``/``Fabric`` connector).

    A plugin whose availability probe fails or does not answer in time is "not available" for the
    run that asked, and only for it: the next run asks again.

    Attributes:
        unavailable: plugin name -> why it is not available for this run.
        answers: accelerator name -> whether it is available, as already answered in this run.
    """

    unavailable: dict[str, str] = field(default_factory=dict)
    answers: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class _Call:
    """The hook call in progress: what the guard of each implementation needs to judge a failure."""

    hook_name: str
    owners: Optional[frozenset[str]]
    run: Optional[Run]
    kwargs: Mapping[str, Any]


_current_call: ContextVar[Optional[_Call]] = ContextVar("trainer_plugins_call", default=None)


@dataclass(frozen=True)
class Answer:
    """A non-``None`` result of one hook implementation, with the record of the plugin that gave it.

    This is what the guarded implementations return through pluggy, so pluggy's tracing and call
    monitoring show which plugin answered.
    """

    plugin: PluginRecord
    value: Any

    def __repr__(self) -> str:
        return f"Answer({self.plugin.name}: {self.value!r})"


class PluginManager(pluggy.PluginManager):
    """A pluggy plugin manager that loads plugins from entry points and isolates their failures.

    Every call into plugin code goes through one guard, :meth:`guard`: importing a plugin, its
    hooks (registered as guarded functions, so that pluggy's own hook callers, ``firstresult``,
    tracing and call monitoring do the calling), loading and building its classes and their
    ``is_available()``. The guard catches every exception but a ``KeyboardInterrupt``
    (``SystemExit`` from a plugin is a fault of the plugin), bounds availability probes by
    ``Controls.probe_timeout``, and names the plugin and its distribution in the error it raises.

    Args:
        controls: block/allow lists and probe timeout to apply; default :meth:`Controls.from_env`,
            read here, before any plugin is imported.

    Raises:
        ControlError: ``TRAINER_PLUGINS_PROBE_TIMEOUT`` holds an unreadable value.
    """

    def __init__(self, controls: Optional[Controls] = None) -> None:
        super().__init__(_hookspecs.PROJECT_NAME)
        self.add_hookspecs(_hookspecs)
        self.controls = controls if controls is not None else Controls.from_env(strict_autoload=False)
        self.records: dict[str, PluginRecord] = {}

    # --- loading ---------------------------------------------------------------------------------

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load and register every plugin advertised in entry-point ``group`` (importlib.metadata).

        Blocked plugins are recorded but not imported. A plugin that fails to import (``SystemExit``
        included), declares an unsupported ``TRAINER_PLUGINS_API`` or fails pluggy's validation is
        quarantined. What a plugin prints while importing is kept in ``record.output``; changes it
        makes to ``os.environ`` are kept in ``record.environ_changes`` and reported (changes to our
        own ``TRAINER_PLUGINS_*`` controls are undone).
        """
        for ep in entry_points(group=group):
            dist = ep.dist
            record = PluginRecord(
                name=ep.name,
                value=ep.value,
                distribution=dist.name if dist is not None else None,
                version=dist.version if dist is not None else None,
            )
            other = self.records.get(ep.name)
            if other is not None and (other.distribution, other.value) == (record.distribution, record.value):
                continue  # already loaded: loading twice changes nothing
            if other is not None:
                self._set_aside(record, f"plugin name {ep.name!r} is also used by {other.label}")
                continue
            self.records[ep.name] = record
            refusal = self.controls.admits(record.name, record.distribution)
            if refusal:
                self._set_state(record, "blocked", refusal)
                self.set_blocked(ep.name)
                continue
            try:
                with _side_effects_of(record):
                    module = self.guard(record, f"import of {ep.value!r}", ep.load)
            except PluginError as fault:
                self.quarantine(record, f"import of {ep.value!r} failed", fault.error)
                continue
            self.register_plugin(module, record)

    def register_plugin(self, plugin: Any, record: PluginRecord) -> bool:
        """Check ``plugin``'s API version, then register its hooks, each guarded, under ``record.name``.

        Returns:
            ``True`` when registered, ``False`` when quarantined instead.
        """
        holder = self.records.get(record.name)
        if holder is not None and holder.plugin is plugin and self.get_plugin(record.name) is not None:
            return True  # registering the same plugin again changes nothing
        if self.get_plugin(record.name) is not None and holder is not None:
            self._set_aside(record, f"plugin name {record.name!r} is already used by {holder.label}")
            return False
        self.records[record.name] = record
        record.plugin = plugin
        try:
            record.api = self.guard(record, "reading TRAINER_PLUGINS_API", getattr, plugin, "TRAINER_PLUGINS_API", None)
            problem = _api_problem(record.api)
            hooks = self.guard(record, "listing its hooks", self._hook_functions, plugin)
        except PluginError as fault:
            self.quarantine(record, "reading its hooks failed", fault.error)
            return False
        if problem:
            self.quarantine(record, problem, None)
            return False
        wrappers = [name for name, (_, opts) in hooks.items() if opts.get("hookwrapper") or opts.get("wrapper")]
        if wrappers:
            self.quarantine(record, f"hook wrappers are not supported ({', '.join(sorted(wrappers))})", None)
            return False
        guarded = SimpleNamespace(
            **{attr: self._guarded_hook(record, opts.get("specname") or attr, fn) for attr, (fn, opts) in hooks.items()}
        )
        try:
            self.register(guarded, name=record.name)
        except Exception as error:
            self.quarantine(record, "registration failed", error)
            return False
        record.hooks = guarded
        return True

    def _hook_functions(self, plugin: Any) -> dict[str, tuple[Any, Mapping[str, Any]]]:
        """Attribute name -> (function, hookimpl options) of every hook implementation of ``plugin``."""
        found: dict[str, tuple[Any, Mapping[str, Any]]] = {}
        for attr in dir(plugin):
            opts = self.parse_hookimpl_opts(plugin, attr)
            if opts is not None:
                found[attr] = (getattr(plugin, attr), opts)
        return found

    # --- the guard -------------------------------------------------------------------------------

    def guard(
        self,
        record: PluginRecord,
        action: str,
        function: Callable[..., Any],
        *args: Any,
        timeout: Optional[float] = None,
        passthrough: tuple[type[BaseException], ...] = (),
        unchanged: tuple[type[BaseException], ...] = (),
        **kwargs: Any,
    ) -> Any:
        """Run plugin code ``function(*args, **kwargs)`` on behalf of ``record``'s plugin; return its result.

        Args:
            record: the plugin the code belongs to.
            function: the plugin's callable (a hook, a class, ``is_available``, an entry point's ``load``).
            *args: positional arguments for ``function``.
            **kwargs: keyword arguments for ``function``.
            action: what is being done, for messages (``"import of 'pkg'"``, ``"XLAAccelerator()"``).
            timeout: if given, seconds after which the call is abandoned (it goes on in a daemon
                thread; a plugin whose earlier call still runs is not called again meanwhile).
            passthrough: exception types that reach the caller with their type kept and the
                plugin's name in front of the message (where the type's constructor allows it).
            unchanged: exception types that are the plugin rejecting the user's input (Lightning's
                own wording): they reach the caller as raised, with a note naming the plugin.

        Raises:
            PluginError: ``function`` raised anything else but ``KeyboardInterrupt`` (``SystemExit``
                included) or did not return within ``timeout``; the message names the plugin, its
                distribution and version, ``action`` and the exception, kept as ``error`` and
                ``__cause__``.
            KeyboardInterrupt: the user interrupted the call.
        """
        try:
            if timeout is None:
                return function(*args, **kwargs)
            return _bounded(record, function, args, kwargs, timeout)
        except KeyboardInterrupt:
            raise
        except PluginError:
            raise
        except unchanged as error:
            add_note(error, f"raised by plugin {record.label}")
            raise
        except passthrough as error:
            raise _named(error, record) from error
        except BaseException as error:
            fault = PluginError(f"plugin {record.label} failed in {action}: {type(error).__name__}: {error}")
            fault.plugin, fault.error = record, error
            raise fault from error

    def _guarded_hook(self, record: PluginRecord, hook_name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (a hook implementation of ``record``'s plugin) as pluggy will call it: guarded.

        ``functools.wraps`` keeps its hookimpl options and signature, so pluggy validates and calls
        it like the original. It returns ``None`` or an :class:`Answer`.
        """

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Optional[Answer]:
            call = _current_call.get() or _Call(hook_name, None, None, {})
            return self._answer(record, call, function, args, kwargs)

        return guarded

    def _answer(
        self, record: PluginRecord, call: _Call, function: Callable[..., Any], args: Any, kwargs: Any
    ) -> Optional[Answer]:
        """Call one hook implementation; judge a failure as the plugin's fault, a probe failure or the user's error."""
        probe = call.hook_name == PROBE_HOOK
        if record.state != "loaded" or (probe and call.run is not None and record.name in call.run.unavailable):
            return None
        timeout = self.controls.probe_timeout if probe and record.name != BUILTIN_PLUGIN else None
        user_errors = USER_ERRORS if call.owners is not None else ()
        problem = ""
        try:
            with _captured_output(record, call.hook_name in _QUIET_HOOKS):
                result = self.guard(
                    record, call.hook_name, function, *args, timeout=timeout, unchanged=user_errors, **kwargs
                )
            problem = _wrong_kind(call.hook_name, result, call.kwargs.get("api"))
            if problem:
                fault = PluginError(f"plugin {record.label} returned {problem} from {call.hook_name}")
                fault.plugin, fault.error = record, TypeError(problem)
                raise fault
        except PluginError as fault:
            if probe:
                self.not_available(record, call.run, fault)
            elif call.owners is not None and record.name in call.owners:
                raise
            else:
                what = f"hook {call.hook_name} returned {problem}" if problem else f"hook {call.hook_name} raised"
                self.quarantine(record, what, None if problem else fault.error)
            return None
        return None if result is None else Answer(record, result)

    # --- states ----------------------------------------------------------------------------------

    def _set_state(self, record: PluginRecord, state: str, reason: str, error: Optional[BaseException] = None) -> None:
        record.state, record.reason, record.error = state, reason, error

    def quarantine(self, record: PluginRecord, reason: str, error: Optional[BaseException]) -> None:
        """Set ``record``'s plugin aside for the process: unregister it, record why, and warn (``PluginWarning``).

        Only for faults of the plugin itself (import failure, wrong API version, a hook raising on
        valid arguments or answering with the wrong kind of object). Its declarations stop counting.
        """
        detail = f"{reason}: {type(error).__name__}: {error}" if error is not None else reason
        self._set_state(record, "quarantined", detail, error)
        if record.hooks is not None and self.is_registered(record.hooks):
            self.unregister(record.hooks)
        warnings.warn(f"trainer-plugins quarantined plugin {record.label}: {detail}", PluginWarning, stacklevel=3)

    def not_available(self, record: PluginRecord, run: Optional[Run], fault: BaseException) -> None:
        """Count ``record``'s plugin as not available for ``run`` (its probe failed) and warn once for the run.

        The plugin stays loaded: the next run asks it again. ``record.unavailable`` keeps the last
        reason for ``trainer-plugins list``/``doctor``.
        """
        reason = str(fault).removeprefix(f"plugin {record.label}: ").removeprefix(f"plugin {record.label} ")
        if not isinstance(fault, PluginError):
            reason = f"{type(fault).__name__}: {reason}"
        record.unavailable = reason
        if run is not None:
            if record.name in run.unavailable:
                return
            run.unavailable[record.name] = reason
        warnings.warn(
            f"trainer-plugins: plugin {record.label} is not available for this run: {reason}."
            " It is asked again on the next Trainer/Fabric.",
            PluginWarning,
            stacklevel=3,
        )

    def _set_aside(self, record: PluginRecord, reason: str) -> None:
        """Quarantine a plugin whose name another plugin holds, keeping its record apart from the holder's."""
        self.records[f"{record.name}@{record.distribution}"] = record
        self.quarantine(record, reason, None)

    def quarantined(self) -> list[PluginRecord]:
        """The records of quarantined plugins."""
        return [record for record in self.records.values() if record.state == "quarantined"]

    def record_of(self, plugin_name: str) -> PluginRecord:
        """The record of plugin ``plugin_name``."""
        return self.records[plugin_name]

    def error_for(self, record: PluginRecord, action: str) -> PluginError:
        """A :class:`PluginError` saying that ``record``'s plugin cannot do ``action``."""
        error = PluginError(f"plugin {record.label} cannot {action}: it is {record.state}: {record.reason}")
        error.plugin, error.error = record, record.error
        error.__cause__ = record.error
        return error

    # --- hook calls, through pluggy's hook callers -----------------------------------------------

    def call_each(
        self, hook_name: str, owners: Optional[frozenset[str]] = None, run: Optional[Run] = None, **kwargs: Any
    ) -> list[tuple[PluginRecord, Any]]:
        """Call ``hook_name`` through pluggy; return ``(record, result)`` for each non-``None`` result.

        Args:
            hook_name: a hook of :mod:`trainer_plugins._hookspecs`.
            owners: ``None`` for declaration and probe hooks; for decision hooks, the names of the
                plugins whose objects the call is about (see :meth:`_answer`).
            run: the run asking (probe failures count for it only).
            **kwargs: every argument of the hook specification.

        Declaration, probe and diagnostic hooks (``owners is None``): a failure or an answer of the
        wrong kind quarantines its plugin, except in the probe, where it makes the plugin not
        available for ``run``. Decision hooks: a user error (:data:`USER_ERRORS`) is the plugin
        rejecting the user's configuration and propagates unchanged. Any other failure is a bug:
        from a plugin in ``owners`` it propagates as :class:`PluginError`; from any other plugin it
        quarantines that plugin and the call goes on.

        Raises:
            TypeError: the core passed an argument that breaks the hook specification (no plugin
                is called, so none is blamed).
        """
        answers = self._call(hook_name, owners, run, kwargs)
        return [(answer.plugin, answer.value) for answer in answers]

    def call_first(
        self, hook_name: str, owners: Optional[frozenset[str]] = None, run: Optional[Run] = None, **kwargs: Any
    ) -> Optional[tuple[PluginRecord, Any]]:
        """Call a ``firstresult`` hook through pluggy; return the first non-``None`` answer with its record."""
        answer = self._call(hook_name, owners, run, kwargs)
        return None if answer is None else (answer.plugin, answer.value)

    def _call(self, hook_name: str, owners: Optional[frozenset[str]], run: Optional[Run], kwargs: Any) -> Any:
        _check_arguments(hook_name, kwargs)
        token = _current_call.set(_Call(hook_name, owners, run, kwargs))
        try:
            return getattr(self.hook, hook_name)(**kwargs)
        finally:
            _current_call.reset(token)


def _named(error: BaseException, record: PluginRecord) -> BaseException:
    """``error`` again, of the same type, with ``record``'s plugin named in front of its message."""
    prefix = f"plugin {record.label}: "
    if str(error).startswith(prefix) or (error.args and not isinstance(error.args[0], str)):
        return error
    try:
        renamed = type(error)(prefix + str(error))
    except Exception:  # a constructor with other arguments: keep the original, with a note
        add_note(error, f"raised by plugin {record.label}")
        return error
    if isinstance(error, ImportError):
        renamed.name, renamed.path = error.name, error.path  # type: ignore[attr-defined]
    return renamed


def add_note(error: BaseException, note: str) -> None:
    """Attach ``note`` to ``error``'s traceback (``BaseException.add_note``, Python >= 3.11)."""
    attach = getattr(error, "add_note", None)
    if attach is not None and note not in getattr(error, "__notes__", ()):
        attach(note)


class ProbeTimeout(TimeoutError):
    """A plugin's call did not answer within the probe timeout (``TRAINER_PLUGINS_PROBE_TIMEOUT``)."""


def _bounded(record: PluginRecord, function: Callable[..., Any], args: Any, kwargs: Any, timeout: float) -> Any:
    """``function(*args, **kwargs)`` in a daemon thread, abandoned after ``timeout`` seconds.

    Python cannot stop a thread, so an abandoned call runs on; until it ends, the plugin is not
    called again (a wedged device driver would only pile up threads).
    """
    if record.pending is not None and record.pending.is_alive():
        raise ProbeTimeout(f"a call from an earlier run has still not answered ({PROBE_TIMEOUT_VARIABLE})")
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the guard in the calling thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name=f"trainer-plugins probe of {record.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        record.pending = thread
        raise ProbeTimeout(f"no answer within {timeout:g} s ({PROBE_TIMEOUT_VARIABLE})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@contextmanager
def _captured_output(record: PluginRecord, capture: bool = True) -> Iterator[None]:
    """Keep what the plugin prints to stdout in ``record.output`` instead of the process's stdout."""
    if not capture:
        yield
        return
    buffer = io.StringIO()
    try:
        with redirect_stdout(buffer):
            yield
    finally:
        record.output += buffer.getvalue()


@contextmanager
def _side_effects_of(record: PluginRecord) -> Iterator[None]:
    """Import-time watch: capture stdout, and record (and report) what the plugin changed in ``os.environ``.

    Changes to our own controls (``TRAINER_PLUGINS_*``) are undone: they were read before plugins
    loaded, and workers must not inherit a plugin's rewrite either.
    """
    before = dict(os.environ)
    try:
        with _captured_output(record):
            yield
    finally:
        changed = {
            key: (before.get(key), os.environ.get(key))
            for key in set(before) | set(os.environ)
            if before.get(key) != os.environ.get(key)
        }
        for key, (old, _) in changed.items():
            if key.startswith(CONTROL_PREFIX):
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
        if changed:
            record.environ_changes = changed
            warnings.warn(
                f"trainer-plugins: plugin {record.label} changed os.environ while importing:"
                f" {describe_changes(changed)}",
                PluginWarning,
                stacklevel=4,
            )


def describe_changes(changed: Mapping[str, tuple[Optional[str], Optional[str]]]) -> str:
    """``"NAME: 'old' -> 'new'"`` for each changed variable; controls are marked as undone."""
    parts = []
    for key in sorted(changed):
        old, new = changed[key]
        text = f"{key}: {'unset' if old is None else repr(old)} -> {'unset' if new is None else repr(new)}"
        if key.startswith(CONTROL_PREFIX):
            text += " (undone: trainer-plugins controls are read before plugins load)"
        parts.append(text)
    return "; ".join(parts)


#: The availability probe: its failures make a plugin not available for one run, never quarantine it.
PROBE_HOOK = "trainer_plugins_accelerator_available"
#: Hooks that listing and ``doctor`` call; what a plugin prints in them is captured like at import.
_QUIET_HOOKS = frozenset({*_hookspecs.DECLARATION_HOOKS.values(), "trainer_plugins_doctor"})
_ROLE_OF_DECLARATION = {hook: role for role, hook in _hookspecs.DECLARATION_HOOKS.items()}
#: Decision hook -> (role whose Lightning base class the answer must be an instance of, names allowed).
_DECISION_KINDS = {
    "trainer_plugins_select_strategy": ("strategy", True),
    "trainer_plugins_select_precision": ("precision", False),
    "trainer_plugins_select_environment": ("environment", False),
}


def _kind(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__} (not an instance)"
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def _wrong_kind(hook_name: str, result: Any, api: Any) -> str:
    """What is wrong with ``result`` as an answer of ``hook_name`` ('' when it is fine)."""
    if result is None:
        return ""
    if hook_name in _ROLE_OF_DECLARATION:
        expected = ENTRY_TYPES[_ROLE_OF_DECLARATION[hook_name]]
        if not isinstance(result, (list, tuple)):
            return f"{_kind(result)}; expected a list of {expected.__name__}"
        wrong = [entry for entry in result if not isinstance(entry, expected)]
        return f"a list holding {_kind(wrong[0])}; expected a list of {expected.__name__}" if wrong else ""
    if hook_name == PROBE_HOOK:
        return "" if isinstance(result, bool) else f"{_kind(result)}; expected True, False or None"
    if hook_name == "trainer_plugins_doctor":
        return "" if isinstance(result, Mapping) else f"{_kind(result)}; expected a dict or None"
    if hook_name in _DECISION_KINDS and api in APIS:
        role, names_allowed = _DECISION_KINDS[hook_name]
        base = resolve_in(ROLE_BASES[(role, api)], package_of(result))  # lightning's or pytorch_lightning's
        if isinstance(result, base) or (names_allowed and isinstance(result, str) and result):
            return ""
        wanted = f"a {base.__module__}.{base.__qualname__} instance" + (
            " or a registered name" if names_allowed else ""
        )
        return f"{_kind(result)}; expected {wanted}"
    return ""


#: Hook argument -> (check, what it must be), for :func:`_check_arguments`.
_ARGUMENT_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "api": (lambda value: value in APIS, f"one of {APIS}"),
    "name": (lambda value: isinstance(value, str), "a str"),
    "num_nodes": (lambda value: isinstance(value, int) and value >= 1, "an int >= 1"),
    "parallel_devices": (lambda value: isinstance(value, list), "a list"),
    "precision": (lambda value: isinstance(value, str), "a str"),
}


def _check_arguments(hook_name: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse a call whose arguments break the hook specification, so no plugin is blamed for the core's bug."""
    for argument, value in kwargs.items():
        rule = _ARGUMENT_RULES.get(argument)
        if rule is not None and not rule[0](value):
            raise TypeError(f"trainer-plugins called {hook_name} with {argument}={value!r}; it must be {rule[1]}")


def _api_problem(declared: Optional[str]) -> Optional[str]:
    """Why a plugin declaring ``TRAINER_PLUGINS_API = declared`` cannot be loaded, or ``None``."""
    version = _hookspecs.HOOKSPEC_VERSION
    if declared is None:
        return f"declares no TRAINER_PLUGINS_API; this trainer-plugins implements hookspec API {version}"
    try:
        supported = SpecifierSet(declared)
    except (InvalidSpecifier, TypeError):
        return f"TRAINER_PLUGINS_API={declared!r} is not a version specifier such as '>=1.0,<2'"
    if not supported.contains(version):
        return f"supports hookspec API {declared}, but this trainer-plugins implements {version}"
    return None


_lock = threading.Lock()
_manager: Optional[PluginManager] = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager: the built-in plugin plus every entry-point plugin.

    Built on first use from the current controls (environment variables) and cached; see
    :func:`reset_plugin_manager`. Importing plugins here never imports a device runtime, as long as
    plugins follow the hook rules.
    """
    global _manager
    with _lock:
        if _manager is None:
            from trainer_plugins import _builtin

            manager = PluginManager()
            builtin = PluginRecord(BUILTIN_PLUGIN, _builtin.__name__, "lightning", _builtin.lightning_version())
            manager.register_plugin(_builtin, builtin)
            manager.load_entry_points()
            _manager = manager
        return _manager


_reset_listeners: list[Callable[[], None]] = []


def on_reset(callback: Callable[[], None]) -> None:
    """Call ``callback`` after every :func:`reset_plugin_manager` (the catalogue forgets its cache)."""
    if callback not in _reset_listeners:
        _reset_listeners.append(callback)


def reset_plugin_manager() -> None:
    """Forget the cached plugin manager (and what was built from it); rebuilt on next use."""
    global _manager
    with _lock:
        _manager = None
    for callback in _reset_listeners:
        callback()


on_change(reset_plugin_manager)
