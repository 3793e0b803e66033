"""Both plugins of this repository pass the conformance kit that trainer-plugins ships to plugin authors."""

import pytest
from plugin_helpers import make_plugin, manager_with

from trainer_plugins.testing import PluginConformance


class TestXLAPlugin(PluginConformance):
    plugin = "xla"


class TestLocalSGDExamplePlugin(PluginConformance):
    plugin = "localsgd"


class _UnmarkedHookPlugin(PluginConformance):  # not collected: run by hand below
    plugin = "unmarked"


def test_the_kit_fails_a_hook_implementation_without_its_marker():
    import unmarked_hook_plugin

    manager = manager_with(("unmarked", unmarked_hook_plugin))
    assert manager.records["unmarked"].state == "loaded"  # pluggy registers it: the marked hook is fine
    with pytest.raises(AssertionError, match=r"not marked @hookimpl: \['trainer_plugins_accelerator_available'\]"):
        _UnmarkedHookPlugin().test_hook_implementations_match_the_specification(manager, manager.records["unmarked"])


def test_the_kit_passes_the_same_hooks_once_marked():
    import unmarked_hook_plugin

    marked = make_plugin(
        accelerators=unmarked_hook_plugin.trainer_plugins_accelerators,
        accelerator_available=unmarked_hook_plugin.trainer_plugins_accelerator_available,
    )
    manager = manager_with(("unmarked", marked))
    _UnmarkedHookPlugin().test_hook_implementations_match_the_specification(manager, manager.records["unmarked"])
