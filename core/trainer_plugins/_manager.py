"""The plugin manager: entry-point discovery, controls, the API handshake and quarantine."""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Optional

import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from trainer_plugins import _hookspecs
from trainer_plugins._controls import Controls

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
    """A plugin failed: it could not be imported, a hook raised, or its API version does not match.

    The message names the plugin, its distribution and version and the original exception, which
    is also chained as ``__cause__``.
    """


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
        plugin: the registered plugin object (``None`` until registered).
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

    @property
    def label(self) -> str:
        """``"name (distribution version)"`` for messages."""
        if self.distribution is None:
            return self.name
        return f"{self.name} ({self.distribution} {self.version})"


class PluginManager(pluggy.PluginManager):
    """A pluggy plugin manager that loads plugins from entry points and isolates their failures.

    Hooks are called one implementation at a time, in pluggy's order (last registered first,
    ``tryfirst``/``trylast`` respected), so that one plugin's exception cannot hide another's answer.

    Args:
        controls: block/allow lists to apply; default :meth:`Controls.from_env`.
    """

    def __init__(self, controls: Optional[Controls] = None) -> None:
        super().__init__(_hookspecs.PROJECT_NAME)
        self.add_hookspecs(_hookspecs)
        self.controls = controls if controls is not None else Controls.from_env()
        self.records: dict[str, PluginRecord] = {}

    # --- loading ---------------------------------------------------------------------------------

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load and register every plugin advertised in entry-point ``group`` (importlib.metadata).

        Blocked plugins are recorded but not imported. A plugin that fails to import, declares an
        unsupported ``TRAINER_PLUGINS_API`` or fails pluggy's validation is quarantined.
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
                module = ep.load()
            except Exception as error:
                self.quarantine(record, f"import of {ep.value!r} failed", error)
                continue
            self.register_plugin(module, record)

    def register_plugin(self, plugin: Any, record: PluginRecord) -> bool:
        """Check ``plugin``'s API version, then register it under ``record.name``.

        Returns:
            ``True`` when registered, ``False`` when quarantined instead.
        """
        registered = self.get_plugin(record.name)
        if registered is plugin:
            return True  # registering the same plugin again changes nothing
        if registered is not None:
            self._set_aside(record, f"plugin name {record.name!r} is already used by {self.records[record.name].label}")
            return False
        self.records[record.name] = record
        record.api = getattr(plugin, "TRAINER_PLUGINS_API", None)
        problem = _api_problem(record.api)
        if problem:
            self.quarantine(record, problem, None)
            return False
        try:
            self.register(plugin, name=record.name)
        except Exception as error:
            self.quarantine(record, "registration failed", error)
            return False
        record.plugin = plugin
        wrappers = [i.function.__name__ for i in self._impls_of(record.name) if i.hookwrapper or i.wrapper]
        if wrappers:
            self.quarantine(record, f"hook wrappers are not supported ({', '.join(wrappers)})", None)
            return False
        return True

    def _impls_of(self, name: str) -> Iterator[pluggy.HookImpl]:
        """The hook implementations of the plugin registered as ``name``."""
        plugin = self.get_plugin(name)
        for caller in self.get_hookcallers(plugin) or []:
            yield from (impl for impl in caller.get_hookimpls() if impl.plugin is plugin)

    # --- states ----------------------------------------------------------------------------------

    def _set_state(self, record: PluginRecord, state: str, reason: str, error: Optional[BaseException] = None) -> None:
        record.state, record.reason, record.error = state, reason, error

    def quarantine(self, record: PluginRecord, reason: str, error: Optional[BaseException]) -> None:
        """Set ``record``'s plugin aside: unregister it, record why, and warn (``PluginWarning``)."""
        detail = f"{reason}: {type(error).__name__}: {error}" if error is not None else reason
        self._set_state(record, "quarantined", detail, error)
        if record.plugin is not None and self.is_registered(record.plugin):
            self.unregister(record.plugin)
        warnings.warn(f"trainer-plugins quarantined plugin {record.label}: {detail}", PluginWarning, stacklevel=3)

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
        error.__cause__ = record.error
        return error

    # --- guarded calls ---------------------------------------------------------------------------

    def call_each(
        self, hook_name: str, owners: Optional[frozenset[str]] = None, **kwargs: Any
    ) -> list[tuple[PluginRecord, Any]]:
        """Call every implementation of ``hook_name``; return ``(record, result)`` for each non-``None`` result.

        Args:
            hook_name: a hook of :mod:`trainer_plugins._hookspecs`.
            owners: ``None`` for declaration and probe hooks; for decision hooks, the names of the
                plugins whose objects the call is about (see :meth:`_call`).
            **kwargs: every argument of the hook specification.
        """
        return list(self._call(hook_name, owners, kwargs))

    def call_first(
        self, hook_name: str, owners: Optional[frozenset[str]] = None, **kwargs: Any
    ) -> Optional[tuple[PluginRecord, Any]]:
        """Call implementations of ``hook_name`` until one returns non-``None``; return it with its record."""
        return next(self._call(hook_name, owners, kwargs), None)

    def _call(
        self, hook_name: str, owners: Optional[frozenset[str]], kwargs: Mapping[str, Any]
    ) -> Iterator[tuple[PluginRecord, Any]]:
        """Yield ``(record, result)`` per implementation, in pluggy's call order.

        Declaration and probe hooks (``owners is None``): any exception quarantines its plugin.
        Decision hooks: a user error (:data:`USER_ERRORS`) is the plugin rejecting the user's
        configuration and propagates unchanged. Any other exception is a bug: from a plugin in
        ``owners`` (whose objects the call is about) it propagates as :class:`PluginError`; from
        any other plugin it quarantines that plugin and the call goes on.
        """
        for impl in reversed(getattr(self.hook, hook_name).get_hookimpls()):
            name = self.get_name(impl.plugin)
            if name is None:  # unregistered (quarantined) during this call
                continue
            record = self.records[name]
            try:
                result = impl.function(*(kwargs[arg] for arg in impl.argnames))
            except Exception as error:
                if owners is not None and isinstance(error, USER_ERRORS):
                    raise
                if owners is None or name not in owners:
                    self.quarantine(record, f"hook {hook_name} raised", error)
                    continue
                raise PluginError(
                    f"plugin {record.label} failed in {hook_name}: {type(error).__name__}: {error}"
                ) from error
            if result is not None:
                yield record, result


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


def reset_plugin_manager() -> None:
    """Forget the cached plugin manager (and the catalogue built from it); rebuilt on next use."""
    global _manager
    with _lock:
        _manager = None
    from trainer_plugins._catalog import reset_catalogs

    reset_catalogs()
