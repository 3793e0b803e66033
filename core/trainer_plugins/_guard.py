"""The guard: every call into plugin code runs here, and a failure becomes a verdict on the plugin.

:func:`guard` runs one piece of plugin code (an entry point's import, a hook, a class, its
``is_available()``) and turns anything it raises but a ``KeyboardInterrupt`` into a
:class:`~trainer_plugins.PluginError` naming the plugin. :func:`examine` (admitting a plugin) and
:func:`judge_hook_call` (one hook implementation) go one step further: they say what the failure
means for the plugin, as a :class:`Verdict` that the plugin manager applies. The guard itself
changes no plugin's state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Optional

from trainer_plugins._errors import USER_ERRORS, PluginError, add_note, named
from trainer_plugins._isolation import bounded_call, captured_output, watched_import
from trainer_plugins._records import BUILTIN_PLUGIN, PluginRecord, Run
from trainer_plugins._spec_checks import PROBE_HOOK, QUIET_HOOKS, api_problem, wrapper_problem, wrong_kind

#: Attribute name -> (function, hookimpl options) of each hook implementation of a plugin.
HookFunctions = Mapping[str, tuple[Callable[..., Any], Mapping[str, Any]]]


def guard(
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
        action: what is being done, for messages (``"import of 'pkg'"``, ``"NPUAccelerator()"``).
        function: the plugin's callable (a hook, a class, ``is_available``, an entry point's ``load``).
        *args: positional arguments for ``function``.
        timeout: if given, seconds after which the call is abandoned (it goes on in a daemon
            thread; a plugin whose earlier call still runs is not called again meanwhile).
        passthrough: exception types that reach the caller with their type kept and the
            plugin's name in front of the message (where the type's constructor allows it).
        unchanged: exception types that are the plugin rejecting the user's input (Lightning's
            own wording): they reach the caller as raised, with a note naming the plugin.
        **kwargs: keyword arguments for ``function``.

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
        return bounded_call(record, function, args, kwargs, timeout)
    except KeyboardInterrupt:
        raise
    except PluginError:
        raise
    except unchanged as error:
        add_note(error, f"raised by plugin {record.label}")
        raise
    except passthrough as error:
        raise named(error, record) from error
    except BaseException as error:
        fault = PluginError(f"plugin {record.label} failed in {action}: {type(error).__name__}: {error}")
        fault.plugin, fault.error = record, error
        raise fault from error


#: The outcomes of a :class:`Verdict`.
ADMIT, ANSWER, BLOCK, SET_ASIDE, QUARANTINE, NOT_AVAILABLE, RAISE = (
    "admit",
    "answer",
    "block",
    "set aside",
    "quarantine",
    "not available",
    "raise",
)


@dataclass(frozen=True)
class Verdict:
    """What becomes of a plugin after a call into it; the plugin manager applies it.

    Attributes:
        outcome: :data:`ADMIT` (register its hooks, ``value``), :data:`ANSWER` (pass ``value`` on,
            ``None`` included), :data:`BLOCK` or :data:`SET_ASIDE` (never imported, or its name
            is taken), :data:`QUARANTINE` (a fault of the plugin: out for the process),
            :data:`NOT_AVAILABLE` (its probe failed: out for this run) or :data:`RAISE` (``error``
            reaches the user: the run is about the plugin's objects).
        value: the hook functions to register (``ADMIT``) or the hook's answer (``ANSWER``).
        reason: why, as the plugin's record will say it.
        error: the plugin's original exception (``QUARANTINE``) or the error to count or raise
            (``NOT_AVAILABLE``, ``RAISE``).
    """

    outcome: str
    value: Any = None
    reason: str = ""
    error: Optional[BaseException] = None


def examine(
    record: PluginRecord, load: Callable[[], Any], action: str, hook_functions: Callable[[Any], HookFunctions]
) -> Verdict:
    """Admitting a plugin: load it, read its ``TRAINER_PLUGINS_API`` and hook implementations, and judge it.

    ``load`` (an entry point's ``load``) runs under the import watch: what it prints and changes in
    ``os.environ`` is recorded. ``record.plugin`` and ``record.api`` keep what was read.

    Args:
        record: the plugin's record.
        load: returns the plugin object (imports it for an entry point).
        action: ``load`` for messages (``"import of 'pkg.hooks'"``).
        hook_functions: lists a plugin's hook implementations (the manager's, with pluggy's markers).

    Returns:
        ``ADMIT`` with the hook functions to register, or ``QUARANTINE`` saying why: the import or
        the reading failed, the API version is not implemented here, or a hook is a wrapper.
    """
    try:
        with watched_import(record):
            plugin = guard(record, action, load)
    except PluginError as fault:
        return Verdict(QUARANTINE, reason=f"{action} failed", error=fault.error)
    record.plugin = plugin
    try:
        record.api = guard(record, "reading TRAINER_PLUGINS_API", getattr, plugin, "TRAINER_PLUGINS_API", None)
        hooks = guard(record, "listing its hooks", hook_functions, plugin)
    except PluginError as fault:
        return Verdict(QUARANTINE, reason="reading its hooks failed", error=fault.error)
    problem = api_problem(record.api) or wrapper_problem({name: opts for name, (_, opts) in hooks.items()})
    return Verdict(QUARANTINE, reason=problem) if problem else Verdict(ADMIT, value=hooks)


@dataclass(frozen=True)
class HookCall:
    """The hook call in progress: what the guard of each implementation needs to judge a failure.

    Attributes:
        hook_name: the hook called.
        owners: ``None`` for declaration, probe and diagnostic hooks; for decision hooks, the
            names of the plugins whose objects the call is about.
        run: the run asking (probe failures count for it only), or ``None``.
        kwargs: the call's arguments.
    """

    hook_name: str
    owners: Optional[frozenset[str]]
    run: Optional[Run]
    kwargs: Mapping[str, Any]


#: The call the plugin manager is making through pluggy (pluggy calls each implementation without it).
current_call: ContextVar[Optional[HookCall]] = ContextVar("trainer_plugins_call", default=None)


def judge_hook_call(
    record: PluginRecord, call: HookCall, function: Callable[..., Any], args: Any, kwargs: Any, probe_timeout: float
) -> Verdict:
    """Call one hook implementation of ``record``'s plugin and judge what came back.

    A plugin that is not loaded, or whose probe already failed in ``call.run``, is not called.
    The probe of a plugin (not Lightning's) is bounded by ``probe_timeout`` seconds. A failure or
    an answer of the wrong kind is judged by the call: in the probe, the plugin is not available
    for the run; from a plugin the call is about (``call.owners``), it reaches the user; anything
    else quarantines the plugin. In a decision hook, a user error (:data:`USER_ERRORS`) is the
    plugin rejecting the user's configuration and propagates unchanged.

    Returns:
        ``ANSWER`` (with the answer, or ``None``), ``NOT_AVAILABLE``, ``RAISE`` or ``QUARANTINE``.
    """
    probe = call.hook_name == PROBE_HOOK
    if record.state != "loaded" or (probe and call.run is not None and record.name in call.run.unavailable):
        return Verdict(ANSWER)
    timeout = probe_timeout if probe and record.name != BUILTIN_PLUGIN else None
    user_errors = USER_ERRORS if call.owners is not None else ()
    try:
        with captured_output(record, call.hook_name in QUIET_HOOKS):
            result = guard(record, call.hook_name, function, *args, timeout=timeout, unchanged=user_errors, **kwargs)
    except PluginError as fault:
        return _judged_fault(record, call, fault, f"hook {call.hook_name} raised", fault.error)
    problem = wrong_kind(call.hook_name, result, call.kwargs.get("api"))
    if problem:
        wrong = PluginError(f"plugin {record.label} returned {problem} from {call.hook_name}")
        wrong.plugin, wrong.error = record, TypeError(problem)
        return _judged_fault(record, call, wrong, f"hook {call.hook_name} returned {problem}", None)
    return Verdict(ANSWER, value=result)


def _judged_fault(
    record: PluginRecord, call: HookCall, fault: PluginError, reason: str, error: Optional[BaseException]
) -> Verdict:
    if call.hook_name == PROBE_HOOK:
        return Verdict(NOT_AVAILABLE, error=fault)
    if call.owners is not None and record.name in call.owners:
        return Verdict(RAISE, error=fault)
    return Verdict(QUARANTINE, reason=reason, error=error)
