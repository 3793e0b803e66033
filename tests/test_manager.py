"""The plugin manager: API handshake, guarded hook calls, quarantine, controls on entry points."""

from __future__ import annotations

import pytest
from plugin_helpers import make_plugin, manager_with

from trainer_plugins import Controls, PluginError, PluginManager, PluginWarning, StrategyEntry


def strategies(*names: str):
    return lambda: [StrategyEntry(name, trainer=f"pkg.{name}:Strategy") for name in names]


@pytest.mark.parametrize(
    ("api", "reason"),
    [
        (None, "declares no TRAINER_PLUGINS_API; this trainer-plugins implements hookspec API 1.3"),
        ("banana", "TRAINER_PLUGINS_API='banana' is not a version specifier such as '>=1.0,<2'"),
        (">=2.0", "supports hookspec API >=2.0, but this trainer-plugins implements 1.3"),
    ],
)
def test_a_plugin_without_a_matching_api_version_is_quarantined_with_the_reason(api, reason):
    with pytest.warns(PluginWarning, match=r"quarantined plugin npu \(npu-dist 1.0\)"):
        manager = manager_with(("npu", make_plugin(api=api, strategies=strategies("npu_ddp"))))
    record = manager.records["npu"]
    assert (record.state, record.reason) == ("quarantined", reason)
    assert manager.get_plugin("npu") is None


def test_a_plugin_with_a_hook_wrapper_is_quarantined():
    def trainer_plugins_strategies():
        yield

    plugin = make_plugin()
    plugin.trainer_plugins_strategies = pytest.importorskip("trainer_plugins").hookimpl(wrapper=True)(
        trainer_plugins_strategies
    )
    with pytest.warns(PluginWarning, match="hook wrappers are not supported"):
        manager = manager_with(("npu", plugin))
    assert manager.records["npu"].state == "quarantined"


def test_a_failing_hook_of_an_uninvolved_plugin_quarantines_it_and_the_call_goes_on():
    def broken():
        raise KeyError("boom")

    manager = manager_with(
        ("good", make_plugin(strategies=strategies("good_ddp"))), ("bad", make_plugin(strategies=broken))
    )
    with pytest.warns(
        PluginWarning,
        match=r"quarantined plugin bad \(bad-dist 1.0\): hook trainer_plugins_strategies raised: KeyError: 'boom'",
    ):
        results = manager.call_each("trainer_plugins_strategies")
    assert [record.name for record, _ in results] == ["good", "lightning"]
    assert manager.records["bad"].state == "quarantined"
    assert isinstance(manager.records["bad"].error, KeyError)


def test_a_user_error_from_the_owning_plugin_reaches_the_user_unchanged():
    def reject(accelerator, strategy, parallel_devices, api):
        raise ValueError("strategy 'ddp' cannot run on the NPU")

    manager = manager_with(("npu", make_plugin(validate=reject)))
    with pytest.raises(ValueError) as info:
        manager.call_each(
            "trainer_plugins_validate",
            frozenset({"npu"}),
            accelerator=None,
            strategy=None,
            parallel_devices=[],
            api="trainer",
        )
    assert str(info.value) == "strategy 'ddp' cannot run on the NPU"
    assert getattr(info.value, "__notes__", ["raised by plugin npu (npu-dist 1.0)"]) == [
        "raised by plugin npu (npu-dist 1.0)"
    ]
    assert manager.records["npu"].state == "loaded"


def test_a_user_error_from_any_plugin_in_a_decision_call_reaches_the_user_and_quarantines_nothing():
    def reject(strategy):
        raise NotImplementedError("this pairing is known but unsupported")

    manager = manager_with(("judge", make_plugin(validate=reject)))
    with pytest.raises(NotImplementedError, match="known but unsupported"):
        manager.call_each(
            "trainer_plugins_validate", frozenset(), accelerator=None, strategy=None, parallel_devices=[], api="trainer"
        )
    assert manager.records["judge"].state == "loaded"


def test_a_bug_in_an_uninvolved_plugin_during_a_decision_quarantines_it():
    def buggy(accelerator):
        raise AttributeError("no such thing")

    manager = manager_with(("other", make_plugin(select_environment=buggy)))
    with pytest.warns(PluginWarning, match="hook trainer_plugins_select_environment raised: AttributeError"):
        assert (
            manager.call_first(
                "trainer_plugins_select_environment", frozenset({"lightning"}), accelerator=None, api="trainer"
            )
            is None
        )
    assert manager.records["other"].state == "quarantined"


def test_a_bug_in_the_owning_plugin_becomes_a_plugin_error_naming_the_distribution_and_the_cause():
    def buggy(accelerator, strategy, parallel_devices, api):
        raise KeyError("missing")

    manager = manager_with(("npu", make_plugin(validate=buggy)))
    with pytest.raises(
        PluginError, match=r"plugin npu \(npu-dist 1.0\) failed in trainer_plugins_validate: KeyError: 'missing'"
    ) as info:
        manager.call_each(
            "trainer_plugins_validate",
            frozenset({"npu"}),
            accelerator=None,
            strategy=None,
            parallel_devices=[],
            api="trainer",
        )
    assert isinstance(info.value.__cause__, KeyError)


def test_call_first_returns_the_first_answer_in_pluggy_order():
    early = make_plugin(select_strategy=lambda accelerator: "early")
    late = make_plugin(select_strategy=lambda accelerator: "late")
    manager = manager_with(("early", early), ("late", late))  # registered last -> called first
    record, answer = manager.call_first(
        "trainer_plugins_select_strategy", accelerator=None, parallel_devices=[], num_nodes=1, api="trainer"
    )
    assert (record.name, answer) == ("late", "late")


def test_entry_point_plugins_named_by_the_block_control_are_recorded_but_not_loaded():
    manager = PluginManager(Controls(block=frozenset({"xla"})))
    manager.load_entry_points()
    assert manager.records["xla"].state == "blocked"
    assert manager.records["xla"].reason == "blocked by TRAINER_PLUGINS_BLOCK (xla)"
    assert manager.get_plugin("xla") is None


def test_entry_point_plugins_outside_the_allow_list_are_not_loaded():
    manager = PluginManager(Controls(allow=frozenset({"someone-else"})))
    manager.load_entry_points()
    assert manager.records["xla"].state == "blocked"
    assert manager.records["xla"].reason == "not in TRAINER_PLUGINS_ALLOW (someone-else)"


def test_registering_the_same_plugin_twice_changes_nothing():
    plugin = make_plugin(strategies=strategies("npu_ddp"))
    manager = manager_with(("npu", plugin))
    from trainer_plugins import PluginRecord

    assert manager.register_plugin(plugin, PluginRecord("npu", "tests.npu", "npu-dist", "1.0")) is True
    assert [record.name for record, _ in manager.call_each("trainer_plugins_strategies")] == ["npu", "lightning"]


def test_a_second_plugin_under_a_taken_name_is_set_aside_and_the_first_keeps_working():
    from trainer_plugins import PluginRecord

    manager = manager_with(("npu", make_plugin(strategies=strategies("npu_ddp"))))
    impostor = make_plugin(strategies=strategies("other"))
    with pytest.warns(
        PluginWarning, match=r"npu \(impostor-dist 2.0\): plugin name 'npu' is already used by npu \(npu-dist 1.0\)"
    ):
        assert manager.register_plugin(impostor, PluginRecord("npu", "tests.impostor", "impostor-dist", "2.0")) is False
    assert manager.records["npu"].distribution == "npu-dist" and manager.records["npu"].state == "loaded"
    assert manager.records["npu@impostor-dist"].state == "quarantined"
    assert [r.name for r, _ in manager.call_each("trainer_plugins_strategies")] == ["npu", "lightning"]


@pytest.mark.parametrize(
    ("hook", "answer", "expected"),
    [
        (
            "select_strategy",
            lambda accelerator: __import__("lightning.pytorch.strategies").pytorch.strategies.SingleDeviceStrategy,
            "returned the class lightning.pytorch.strategies.single_device.SingleDeviceStrategy (not an instance)",
        ),
        ("select_precision", lambda accelerator: "bf16-true", "returned the string 'bf16-true'; expected a"),
        ("select_environment", lambda accelerator: "slurm", "returned the string 'slurm'; expected a"),
    ],
)
def test_a_decision_answer_of_the_wrong_kind_quarantines_an_uninvolved_plugin_and_fails_its_own_run(
    hook, answer, expected
):
    pytest.importorskip("lightning")
    arguments = {
        "select_strategy": {"accelerator": None, "parallel_devices": [], "num_nodes": 1},
        "select_precision": {"accelerator": None, "strategy": None, "precision": "32-true", "precision_input": None},
        "select_environment": {"accelerator": None},
    }[hook]
    own = manager_with(("npu", make_plugin(**{hook: answer})))
    with pytest.raises(
        PluginError, match=r"plugin npu \(npu-dist 1.0\) " + expected.replace("(", r"\(").replace(")", r"\)")
    ):
        own.call_first(f"trainer_plugins_{hook}", frozenset({"npu"}), api="trainer", **arguments)
    other = manager_with(("npu", make_plugin(**{hook: answer})))
    with pytest.warns(
        PluginWarning, match=f"hook trainer_plugins_{hook} " + expected.replace("(", r"\(").replace(")", r"\)")
    ):
        assert other.call_first(f"trainer_plugins_{hook}", frozenset({"lightning"}), api="trainer", **arguments) is None
    assert other.records["npu"].state == "quarantined"


def test_a_plugin_raising_system_exit_in_a_hook_is_quarantined_not_the_process_ended():
    def leave():
        raise SystemExit(3)

    manager = manager_with(("npu", make_plugin(strategies=leave)))
    with pytest.warns(PluginWarning, match="hook trainer_plugins_strategies raised: SystemExit: 3"):
        manager.call_each("trainer_plugins_strategies")
    assert manager.records["npu"].state == "quarantined"


def test_a_wrong_argument_from_the_core_blames_no_plugin():
    manager = manager_with(("npu", make_plugin(select_environment=lambda accelerator: None)))
    with pytest.raises(TypeError, match="api='torch'; it must be one of"):
        manager.call_first("trainer_plugins_select_environment", frozenset(), accelerator=None, api="torch")
    assert manager.records["npu"].state == "loaded"


def test_hook_calls_go_through_pluggys_hook_callers_and_its_monitoring():
    manager = manager_with(("npu", make_plugin(strategies=strategies("npu_ddp"))))
    seen = []
    undo = manager.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append(name), lambda *args: None)
    try:
        manager.call_each("trainer_plugins_strategies")
    finally:
        undo()
    assert seen == ["trainer_plugins_strategies"]


def core_imports() -> dict[str, set[str]]:
    """Module of ``trainer_plugins`` (and the start-up module) -> the ones it imports, in functions too.

    ``from trainer_plugins import name`` goes through the package's export table (names resolved on
    first use), so it counts as importing the package, not the module behind the name.
    """
    import ast
    import importlib.util
    from pathlib import Path

    package = Path(importlib.util.find_spec("trainer_plugins").origin).parent
    sources = {path.stem: path for path in package.glob("*.py") if path.stem != "__init__"}
    sources["_trainer_plugins_autoload"] = Path(importlib.util.find_spec("_trainer_plugins_autoload").origin)
    imports = {}
    for module, path in sources.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("trainer_plugins.") or name == "_trainer_plugins_autoload":
                    found.add(name.removeprefix("trainer_plugins.").partition(".")[0])
            if isinstance(node, ast.ImportFrom) and node.module == "trainer_plugins":
                found.update(alias.name for alias in node.names if alias.name in sources)
        imports[module] = found - {module}
    return imports


def test_the_core_modules_import_one_another_in_no_circle():
    imports = core_imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in sorted(imports[module]):
                visit(imported, (*path, module))
            done.add(module)

    for module in sorted(imports):
        visit(module, ())


def test_the_manager_and_the_modules_below_it_import_nothing_above_them():
    imports = core_imports()
    below = {"_records", "_errors", "_controls", "_entries", "_hookspecs", "_isolation", "_spec_checks", "_guard"}
    above = {"_singleton", "_catalog", "_names", "_pins", "_availability", "_is_distributed", "_explanation"}
    above |= {"_connector", "_lightning", "_lightning_checkpoint", "_lightning_compile", "_cli", "_attach", "_install"}
    for module in below | {"_manager"}:
        assert not imports[module] & above, f"trainer_plugins.{module} imports {imports[module] & above}"
