"""Conformance kit for plugin authors (a pytest plugin, loaded through the ``pytest11`` entry point).

In the test suite of a plugin distribution, with the plugin installed::

    from trainer_plugins.testing import PluginConformance

    class TestMyPlugin(PluginConformance):
        plugin = "myplugin"  # the entry-point name in the `trainer_plugins` group

Every ``test_*`` method below then runs against the installed plugin: it loads with a supported
hookspec API; its hook implementations match the specification; every declared class imports and
subclasses the Lightning base of its role; its names are unique and take no Lightning or other
plugin's name without ``override=True``; its declarations and probes import no device runtime and
change no environment variable; its pre-start environment hook, if any, answers only for its own
runs and writes no variable; loading it twice changes nothing; Lightning's strategy names keep
their meaning on Lightning's own accelerators.

The fixtures ``trainer_plugins_manager`` and ``trainer_plugins_catalog`` (a freshly discovered
plugin set, independent of the process-wide one) are available to any test. Importing this module
imports neither torch nor Lightning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

#: Modules a declaration or probe must not import (device runtimes, and the frameworks above them).
HEAVY_MODULES = ("torch", "lightning", "torch_xla", "jax", "tensorflow")


@pytest.fixture
def trainer_plugins_manager() -> Any:
    """A plugin manager with the built-in plugin and every installed entry-point plugin, built for this test."""
    from trainer_plugins import PluginManager, PluginRecord, _builtin

    manager = PluginManager()
    manager.register_plugin(
        _builtin, PluginRecord("lightning", _builtin.__name__, "lightning", _builtin.lightning_version())
    )
    manager.load_entry_points()
    return manager


@pytest.fixture
def trainer_plugins_catalog(trainer_plugins_manager: Any) -> Any:
    """The catalogue of names of :func:`trainer_plugins_manager`."""
    from trainer_plugins import Catalog

    return Catalog.build(trainer_plugins_manager)


def _run_isolated(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


class PluginConformance:
    """Tests every trainer-plugins plugin must pass; subclass it and set :attr:`plugin`."""

    #: The plugin's entry-point name in the ``trainer_plugins`` group.
    plugin: str = ""

    @pytest.fixture
    def record(self, trainer_plugins_manager: Any) -> Any:
        assert self.plugin, f"{type(self).__name__}.plugin must name the plugin's entry point"
        assert self.plugin in trainer_plugins_manager.records, f"no plugin {self.plugin!r} is installed"
        return trainer_plugins_manager.records[self.plugin]

    @pytest.fixture
    def claims(self, trainer_plugins_catalog: Any, record: Any) -> list[Any]:
        return trainer_plugins_catalog.declared.get(self.plugin, [])

    def test_loads_with_a_supported_hookspec_api(self, record: Any) -> None:
        assert record.state == "loaded", f"{record.label} is {record.state}: {record.reason}"
        assert record.api, "declare TRAINER_PLUGINS_API, e.g. '>=1.0,<2'"

    def test_hook_implementations_match_the_specification(self, trainer_plugins_manager: Any, record: Any) -> None:
        trainer_plugins_manager.check_pending()  # unknown hook names
        # the plugin's own module: pluggy holds the guarded copies of its marked functions only
        module = record.plugin
        assert module is not None, f"{record.label} was never imported: {record.reason}"
        marked = {name for name in dir(module) if trainer_plugins_manager.parse_hookimpl_opts(module, name) is not None}
        named_like_hooks = {
            name for name in dir(module) if name.startswith("trainer_plugins_") and callable(getattr(module, name))
        }
        assert named_like_hooks <= marked, (
            f"functions named like hooks but not marked @hookimpl: {sorted(named_like_hooks - marked)}"
        )
        assert marked, "the plugin implements no hook"

    def test_declares_something(self, claims: list[Any]) -> None:
        assert claims, "the plugin declares no accelerator, strategy, precision or environment"

    def test_declared_classes_import_and_subclass_the_lightning_base_of_their_role(self, claims: list[Any]) -> None:
        from trainer_plugins._entries import APIS

        for claim in claims:
            for api in APIS:
                if claim.entry.class_path(api) is not None:
                    claim.entry.load(api)  # raises ImportError or TypeError on failure

    def test_names_are_unique_and_take_no_name_without_override(
        self, claims: list[Any], trainer_plugins_catalog: Any
    ) -> None:
        seen: dict[tuple[str, str], Any] = {}
        for claim in claims:
            key = (claim.entry.role, claim.name)
            assert key not in seen or seen[key] is claim.entry, (
                f"{claim.entry.role} name {claim.name!r} is declared twice"
            )
            seen[key] = claim.entry
        for conflict in trainer_plugins_catalog.conflicts:
            ours = [claim for claim in conflict.claims if claim.plugin.name == self.plugin]
            if ours:
                assert conflict.winner is not None and all(claim.entry.override for claim in ours), conflict.describe()

    def test_declarations_and_probes_import_no_runtime_and_touch_no_environment(self, claims: list[Any]) -> None:
        accelerators = sorted({claim.name for claim in claims if claim.entry.role == "accelerator"})
        report = _run_isolated(
            f"""
            import json, os, sys
            before = dict(os.environ)
            from trainer_plugins import PluginManager, Catalog
            manager = PluginManager()
            manager.load_entry_points()
            Catalog.build(manager)
            def ask(name):
                answer = manager.call_first("trainer_plugins_accelerator_available", name=name)
                return None if answer is None else answer[1]
            answers = [[ask(name), ask(name)] for name in {accelerators!r}]
            print(json.dumps({{
                "state": manager.records[{self.plugin!r}].state,
                "imported": sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules),
                "environment_changed": sorted(
                    k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)
                ),
                "answers": answers,
            }}))
            """
        )
        assert report["state"] == "loaded"
        assert report["imported"] == [], f"declarations or probes imported {report['imported']}"
        assert report["environment_changed"] == [], f"declarations or probes changed {report['environment_changed']}"
        assert all(first == second for first, second in report["answers"]), "a probe answered differently twice"

    def test_launch_environment_is_for_its_own_runs_and_writes_no_variable(
        self, trainer_plugins_manager: Any, record: Any
    ) -> None:
        """The pre-start environment hook answers ``None`` for Lightning's CPU run and leaves ``os.environ`` alone.

        The core sets what the hook returns, and only where unset; a hook writing ``os.environ`` itself
        would overwrite what the user or the engine set.
        """
        if not hasattr(record.plugin, "trainer_plugins_launch_environment"):
            pytest.skip("the plugin names no launch environment (trainer_plugins_launch_environment)")
        import torch
        from lightning.pytorch.accelerators import CPUAccelerator
        from lightning.pytorch.strategies import SingleDeviceStrategy

        before = dict(os.environ)
        answers = trainer_plugins_manager.call_each(
            "trainer_plugins_launch_environment",
            frozenset({"lightning"}),
            accelerator=CPUAccelerator(),
            strategy=SingleDeviceStrategy(torch.device("cpu")),
            num_nodes=1,
            processes_per_node=1,
            started_externally=False,
            api="trainer",
        )
        changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
        os.environ.clear()
        os.environ.update(before)
        assert changed == [], f"trainer_plugins_launch_environment wrote {changed} into os.environ"
        ours = [answer for owner, answer in answers if owner.name == self.plugin]
        assert ours == [], f"trainer_plugins_launch_environment answered {ours[0]!r} for Lightning's CPU run"

    def test_lightnings_strategy_names_keep_their_meaning_on_lightnings_accelerators(
        self, trainer_plugins_manager: Any, record: Any
    ) -> None:
        """``trainer_plugins_strategy_for_name`` answers ``None`` for every Lightning name on Lightning's CPU."""
        from lightning.fabric.accelerators import CPUAccelerator as FabricCPUAccelerator
        from lightning.pytorch.accelerators import CPUAccelerator

        from trainer_plugins._builtin import STRATEGIES

        for api, accelerator in (("trainer", CPUAccelerator()), ("fabric", FabricCPUAccelerator())):
            for name in (name for entry in STRATEGIES if entry.class_path(api) for name in entry.names):
                answer = trainer_plugins_manager.call_first(
                    "trainer_plugins_strategy_for_name",
                    frozenset({self.plugin}),
                    name=name,
                    accelerator=accelerator,
                    api=api,
                )
                assert answer is None or answer[0].name != self.plugin, (
                    f"strategy={name!r} on Lightning's CPU ({api}) was answered {answer[1]!r}"
                )

    def test_loading_twice_changes_nothing(self, trainer_plugins_manager: Any, record: Any) -> None:
        from trainer_plugins import Catalog

        before = {name: (r.state, r.distribution, r.version) for name, r in trainer_plugins_manager.records.items()}
        names_before = Catalog.build(trainer_plugins_manager).declared.get(self.plugin, [])
        trainer_plugins_manager.load_entry_points()
        after = {name: (r.state, r.distribution, r.version) for name, r in trainer_plugins_manager.records.items()}
        names_after = Catalog.build(trainer_plugins_manager).declared.get(self.plugin, [])
        assert after == before
        assert [c.name for c in names_after] == [c.name for c in names_before]
