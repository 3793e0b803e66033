"""The plugin manager: the registry of plugins, loading them from entry points, and calling their hooks.

Calls into plugin code go through the guard (:mod:`trainer_plugins._guard`), which returns a
:class:`~trainer_plugins._guard.Verdict`; this module applies verdicts, and is the only one that
changes a plugin's state.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from types import SimpleNamespace
from typing import Any, Optional

import pluggy

from trainer_plugins import _hookspecs
from trainer_plugins._controls import Controls
from trainer_plugins._errors import PluginError, PluginWarning, plugin_error
from trainer_plugins._guard import (
    ADMIT,
    ANSWER,
    BLOCK,
    NOT_AVAILABLE,
    QUARANTINE,
    RAISE,
    SET_ASIDE,
    HookCall,
    HookFunctions,
    Verdict,
    current_call,
    examine,
    judge_hook_call,
)
from trainer_plugins._records import Answer, PluginRecord, Run
from trainer_plugins._spec_checks import check_arguments

#: Entry-point group a plugin distribution registers its hook module under.
ENTRY_POINT_GROUP = "trainer_plugins"


class PluginManager(pluggy.PluginManager):
    """A pluggy plugin manager that loads plugins from entry points and isolates their failures.

    Every call into plugin code goes through the guard (:mod:`trainer_plugins._guard`): importing a
    plugin, its hooks (registered as guarded functions, so that pluggy's own hook callers,
    ``firstresult``, tracing and call monitoring do the calling), loading and building its classes
    and their ``is_available()``. The guard catches every exception but a ``KeyboardInterrupt``
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

    # --- admitting plugins -----------------------------------------------------------------------

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load and register every plugin advertised in entry-point ``group`` (importlib.metadata).

        Blocked plugins are recorded but not imported. A plugin that fails to import (``SystemExit``
        included), declares an unsupported ``TRAINER_PLUGINS_API`` or fails pluggy's validation is
        quarantined. What a plugin prints while importing is kept in ``record.output``; changes it
        makes to ``os.environ`` are kept in ``record.environ_changes`` and reported (changes to our
        own ``TRAINER_PLUGINS_*`` controls are undone).

        pluggy's ``load_setuptools_entrypoints`` is not used: of what it does, only finding the
        entry points of ``group`` in ``importlib.metadata`` fits, and that is one call here. It calls
        ``EntryPoint.load()`` unguarded, so one plugin's failing import (or ``SystemExit``) would end
        the loading of every later one and nothing would capture its prints or environment changes;
        it skips a second distribution using a taken name silently, where this reports a conflict;
        it blocks by plugin name only, with no record, where the controls also block by
        distribution name and ``trainer-plugins list`` shows why; and it registers the plugin module
        itself, where this registers the guarded hooks after the API handshake. (So pluggy's
        ``list_plugin_distinfo()`` stays empty: each :class:`PluginRecord` names its distribution.)
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
                verdict = Verdict(SET_ASIDE, reason=f"plugin name {ep.name!r} is also used by {other.label}")
            elif refusal := self.controls.admits(record.name, record.distribution):
                verdict = Verdict(BLOCK, reason=refusal)
            else:
                verdict = examine(record, ep.load, f"import of {ep.value!r}", self._hook_functions)
            self._admit(record, verdict)

    def register_plugin(self, plugin: Any, record: PluginRecord) -> bool:
        """Check ``plugin``'s API version, then register its hooks, each guarded, under ``record.name``.

        Returns:
            ``True`` when registered, ``False`` when quarantined instead.
        """
        holder = self.records.get(record.name)
        if holder is not None and self.get_plugin(record.name) is not None:
            if holder.plugin is plugin:
                return True  # registering the same plugin again changes nothing
            verdict = Verdict(SET_ASIDE, reason=f"plugin name {record.name!r} is already used by {holder.label}")
        else:
            verdict = examine(record, lambda: plugin, f"loading {record.value!r}", self._hook_functions)
        return self._admit(record, verdict)

    def _hook_functions(self, plugin: Any) -> HookFunctions:
        """Attribute name -> (function, hookimpl options) of every hook implementation of ``plugin``."""
        found = {}
        for attr in dir(plugin):
            opts = self.parse_hookimpl_opts(plugin, attr)
            if opts is not None:
                found[attr] = (getattr(plugin, attr), opts)
        return found

    def _admit(self, record: PluginRecord, verdict: Verdict) -> bool:
        """Apply the verdict on a plugin asking to be registered: record it, then register its guarded hooks.

        A plugin set aside is recorded as ``"name@distribution"``, apart from the holder of its name.
        """
        aside = verdict.outcome == SET_ASIDE
        self.records[f"{record.name}@{record.distribution}" if aside else record.name] = record
        if verdict.outcome != ADMIT:
            self._apply(record, Verdict(QUARANTINE, reason=verdict.reason) if aside else verdict)
            return False
        guarded = SimpleNamespace(
            **{
                attr: self._guarded_hook(record, opts.get("specname") or attr, function)
                for attr, (function, opts) in verdict.value.items()
            }
        )
        try:
            self.register(guarded, name=record.name)
        except Exception as error:  # pluggy's validation: the plugin's hooks do not match the specification
            self._apply(record, Verdict(QUARANTINE, reason="registration failed", error=error))
            return False
        record.hooks = guarded
        return True

    def _guarded_hook(self, record: PluginRecord, hook_name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (a hook implementation of ``record``'s plugin) as pluggy will call it: guarded.

        ``functools.wraps`` keeps its hookimpl options and signature, so pluggy validates and calls
        it like the original. It returns ``None`` or an :class:`Answer`.
        """

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Optional[Answer]:
            call = current_call.get() or HookCall(hook_name, None, None, {})
            verdict = judge_hook_call(record, call, function, args, kwargs, self.controls.probe_timeout)
            answer = self._apply(record, verdict, call.run)
            return None if answer is None else Answer(record, answer)

        return guarded

    # --- states ----------------------------------------------------------------------------------

    def _apply(self, record: PluginRecord, verdict: Verdict, run: Optional[Run] = None) -> Any:
        """Carry out ``verdict`` on ``record``'s plugin; return the answer it carries (``None`` if none).

        Raises:
            PluginError: the verdict is :data:`~trainer_plugins._guard.RAISE`.
        """
        if verdict.outcome == RAISE:
            assert verdict.error is not None
            raise verdict.error
        if verdict.outcome == NOT_AVAILABLE:
            assert verdict.error is not None
            self.not_available(record, run, verdict.error)
        elif verdict.outcome == BLOCK:
            record.state, record.reason = "blocked", verdict.reason
            self.set_blocked(record.name)
        elif verdict.outcome == QUARANTINE:
            self._quarantine(record, verdict.reason, verdict.error)
        return verdict.value if verdict.outcome == ANSWER else None

    def _quarantine(self, record: PluginRecord, reason: str, error: Optional[BaseException]) -> None:
        """Set ``record``'s plugin aside for the process: unregister it, record why, and warn (``PluginWarning``).

        Only for faults of the plugin itself (import failure, wrong API version, a hook raising on
        valid arguments or answering with the wrong kind of object). Its declarations stop counting.
        """
        detail = f"{reason}: {type(error).__name__}: {error}" if error is not None else reason
        record.state, record.reason, record.error = "quarantined", detail, error
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

    def quarantined(self) -> list[PluginRecord]:
        """The records of quarantined plugins."""
        return [record for record in self.records.values() if record.state == "quarantined"]

    def record_of(self, plugin_name: str) -> PluginRecord:
        """The record of plugin ``plugin_name``."""
        return self.records[plugin_name]

    def error_for(self, record: PluginRecord, action: str) -> PluginError:
        """A :class:`PluginError` saying that ``record``'s plugin cannot do ``action``."""
        message = f"plugin {record.label} cannot {action}: it is {record.state}: {record.reason}"
        return plugin_error(message, record, record.error)

    # --- hook calls, through pluggy's hook callers -----------------------------------------------

    def call_each(
        self, hook_name: str, owners: Optional[frozenset[str]] = None, run: Optional[Run] = None, **kwargs: Any
    ) -> list[tuple[PluginRecord, Any]]:
        """Call ``hook_name`` through pluggy; return ``(record, result)`` for each non-``None`` result.

        Args:
            hook_name: a hook of :mod:`trainer_plugins._hookspecs`.
            owners: ``None`` for declaration and probe hooks; for decision hooks, the names of the
                plugins whose objects the call is about (see :func:`trainer_plugins._guard.judge_hook_call`).
            run: the run asking (probe failures count for it only).
            **kwargs: every argument of the hook specification.

        Declaration, probe and diagnostic hooks (``owners is None``): a failure or an answer of the
        wrong kind quarantines its plugin, except in the probe, where it makes the plugin not
        available for ``run``. Decision hooks: a user error (``ValueError``, ``TypeError``,
        ``NotImplementedError``, ``ModuleNotFoundError``) is the plugin rejecting the user's
        configuration and propagates unchanged. Any other failure is a bug: from a plugin in
        ``owners`` it propagates as :class:`PluginError`; from any other plugin it quarantines that
        plugin and the call goes on.

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
        check_arguments(hook_name, kwargs)
        token = current_call.set(HookCall(hook_name, owners, run, kwargs))
        try:
            return getattr(self.hook, hook_name)(**kwargs)
        finally:
            current_call.reset(token)
