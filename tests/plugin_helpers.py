"""In-memory plugins for unit tests of the core (real distributions are in tests/fixtures/)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from trainer_plugins import Catalog, PluginManager, PluginRecord, _builtin, hookimpl

API = ">=1.0,<2"


def make_plugin(api: Optional[str] = API, **hooks: Callable[..., Any]) -> SimpleNamespace:
    """A plugin object whose attributes are hook implementations named ``trainer_plugins_<key>``."""
    attributes: dict[str, Any] = {f"trainer_plugins_{name}": hookimpl(function) for name, function in hooks.items()}
    if api is not None:
        attributes["TRAINER_PLUGINS_API"] = api
    return SimpleNamespace(**attributes)


def manager_with(*plugins: tuple[str, Any], builtin: bool = True, controls: Any = None) -> PluginManager:
    """A fresh manager (no entry points) holding the built-in plugin and ``(name, plugin)`` pairs."""
    from trainer_plugins import Controls

    manager = PluginManager(controls if controls is not None else Controls())
    if builtin:
        manager.register_plugin(_builtin, PluginRecord("lightning", _builtin.__name__, "lightning", "2.x"))
    for name, plugin in plugins:
        manager.register_plugin(plugin, PluginRecord(name, f"tests.{name}", f"{name}-dist", "1.0"))
    return manager


def catalog_with(*plugins: tuple[str, Any], builtin: bool = True) -> Catalog:
    """The catalogue of :func:`manager_with`."""
    return Catalog.build(manager_with(*plugins, builtin=builtin))


def require_fixture_plugins(distribution_name: str, what: str) -> None:
    """Skip the calling test module unless fixture distribution ``distribution_name`` is installed.

    The fixture plugins under tests/fixtures/ are installed only in the ``platform`` tox environment;
    ``what`` says which of them the module needs, in the skip reason.
    """
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(distribution_name)
    except PackageNotFoundError:
        pytest.skip(f"the {what} are installed only in the `platform` tox environment", allow_module_level=True)
