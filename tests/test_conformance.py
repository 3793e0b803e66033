"""Both plugins of this repository pass the conformance kit that trainer-plugins ships to plugin authors."""

import os

import pytest
from plugin_helpers import make_plugin, manager_with

from trainer_plugins import AcceleratorEntry
from trainer_plugins.testing import PluginConformance


class TestXLAPlugin(PluginConformance):
    plugin = "xla"


class TestLocalSGDExamplePlugin(PluginConformance):
    plugin = "localsgd"


class _UnmarkedHookPlugin(PluginConformance):  # not collected: run by hand below
    plugin = "unmarked"


class _PrestartPlugin(PluginConformance):  # not collected: run by hand below
    plugin = "prestart_kit"


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


def _launch_environment_plugin(launch_environment):
    return make_plugin(
        api=">=1.2,<2",
        accelerators=lambda: [AcceleratorEntry("prestart_kit", trainer="fake_accelerators:FakeAccelerator")],
        launch_environment=launch_environment,
    )


def test_the_kit_fails_a_launch_environment_that_writes_a_variable(monkeypatch):
    monkeypatch.delenv("TP_KIT_VARIABLE", raising=False)

    def writes(accelerator):
        os.environ["TP_KIT_VARIABLE"] = "1"

    manager = manager_with(("prestart_kit", _launch_environment_plugin(writes)))
    with pytest.raises(AssertionError, match=r"wrote \['TP_KIT_VARIABLE'\] into os.environ"):
        _PrestartPlugin().test_launch_environment_is_for_its_own_runs_and_writes_no_variable(
            manager, manager.records["prestart_kit"]
        )
    assert "TP_KIT_VARIABLE" not in os.environ  # the kit put the environment back


def test_the_kit_fails_a_launch_environment_that_answers_for_lightnings_run():
    manager = manager_with(("prestart_kit", _launch_environment_plugin(lambda accelerator: {"X": "1"})))
    with pytest.raises(AssertionError, match="answered {'X': '1'} for Lightning's CPU run"):
        _PrestartPlugin().test_launch_environment_is_for_its_own_runs_and_writes_no_variable(
            manager, manager.records["prestart_kit"]
        )


def test_the_kit_passes_a_launch_environment_for_its_own_accelerator_only():
    from fake_accelerators import FakeAccelerator

    def own(accelerator):
        return {"X": "1"} if isinstance(accelerator, FakeAccelerator) else None

    manager = manager_with(("prestart_kit", _launch_environment_plugin(own)))
    _PrestartPlugin().test_launch_environment_is_for_its_own_runs_and_writes_no_variable(
        manager, manager.records["prestart_kit"]
    )
