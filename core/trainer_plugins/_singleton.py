"""The process-wide plugin manager: built on first use, forgotten when the controls change."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Optional

from trainer_plugins._controls import on_change
from trainer_plugins._manager import PluginManager
from trainer_plugins._records import BUILTIN_PLUGIN, PluginRecord

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
