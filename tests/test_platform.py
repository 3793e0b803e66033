"""Real broken and conflicting plugin distributions next to working ones (tox environment `platform`).

Installed there from tests/fixtures/: one plugin fails at import, one hook raises, one is written
for hookspec API 2, and two claim the same strategy name. None of them may break `import
lightning`, a Trainer that does not select them, or the other plugins; selecting one gives an error
naming its distribution, version and original exception.
"""

from __future__ import annotations

import json
from importlib.metadata import distribution

import pytest
from conftest import run_python
from plugin_helpers import require_fixture_plugins

require_fixture_plugins("tp-fixture-twin-a", "broken fixture plugins")

L = pytest.importorskip("lightning")

import trainer_plugins  # noqa: E402
from trainer_plugins import PluginConflictError, PluginError  # noqa: E402


def listing(env=None) -> dict:
    """``trainer-plugins --json list`` in a fresh process, with the hook calls and probe threads it made."""
    result = run_python(
        """
        import json, sys, threading
        from trainer_plugins import get_plugin_manager
        from trainer_plugins._cli import main
        called = []
        get_plugin_manager().add_hookcall_monitoring(lambda hook, impls, kwargs: called.append(hook), lambda *a: None)
        main(["--json", "list"])
        print(json.dumps({"hooks called": called,
                          "probe threads": [t.name for t in threading.enumerate() if "probe" in t.name],
                          "imported": sorted(m for m in ("torch", "lightning", "torch_xla") if m in sys.modules)}))
        """,
        env=env,
    )
    *listing_lines, calls = result.stdout.strip().splitlines()
    return {**json.loads("\n".join(listing_lines)), **json.loads(calls), "stderr": result.stderr}


#: The hooks a listing calls, once each: the declarations. No probe, so a wedged driver cannot slow it.
DECLARATION_HOOKS = [
    "trainer_plugins_accelerators",
    "trainer_plugins_strategies",
    "trainer_plugins_precisions",
    "trainer_plugins_environments",
]


def test_list_reports_every_plugin_with_its_state_and_why_without_probing_or_importing_a_runtime():
    found = listing()
    plugins = {plugin["name"]: plugin for plugin in found["plugins"]}
    state = {name: (p["distribution"], p["version"], p["state"]) for name, p in plugins.items()}
    assert state == {
        "lightning": ("lightning", distribution("lightning").version, "loaded"),
        "xla": ("xla-plugins", "0.1.0", "loaded"),
        "localsgd": ("trainer-plugins-localsgd", "0.1.0", "loaded"),
        "broken_import": ("tp-fixture-broken-import", "0.1.0", "quarantined"),
        "raising_hook": ("tp-fixture-raising-hook", "0.2.0", "quarantined"),
        "wrong_api": ("tp-fixture-wrong-api", "0.3.0", "quarantined"),
        "twin_a": ("tp-fixture-twin-a", "1.0.0", "loaded"),
        "twin_b": ("tp-fixture-twin-b", "1.0.0", "loaded"),
        "hanging_probe": ("tp-fixture-hanging-probe", "0.1.0", "loaded"),
        "exit_at_import": ("tp-fixture-exit-at-import", "0.1.0", "quarantined"),
        "missing_class": ("tp-fixture-missing-class", "0.1.0", "loaded"),
        "raising_available": ("tp-fixture-raising-available", "0.1.0", "loaded"),
        "wrong_kind": ("tp-fixture-wrong-kind", "0.1.0", "loaded"),
        "printing": ("tp-fixture-printing", "0.1.0", "loaded"),
        "environ_mutating": ("tp-fixture-environ-mutating", "0.1.0", "loaded"),
    }
    assert (
        plugins["broken_import"]["reason"]
        == "import of 'broken_import_plugin' failed: ImportError: the NPU driver library libnpu.so is missing"
    )
    assert (
        plugins["raising_hook"]["reason"]
        == "hook trainer_plugins_strategies raised: RuntimeError: strategy table corrupted"
    )
    assert plugins["wrong_api"]["reason"] == "supports hookspec API >=2.0,<3, but this trainer-plugins implements 1.3"
    assert [item["name"] for item in plugins["localsgd"]["provides"]["strategy"]] == ["local_sgd", "local_sgd_8"]
    assert (
        "strategy 'twin' is claimed by twin_a (tp-fixture-twin-a 1.0.0), twin_b (tp-fixture-twin-b 1.0.0);"
        " none declared override=True, so the name is unusable"
    ) in found["conflicts"]
    assert found["imported"] == []
    assert found["hooks called"] == DECLARATION_HOOKS  # the hanging probe is never asked
    assert found["probe threads"] == []  # nor is any accelerator's is_available(): no call abandoned


def test_blocked_plugins_are_listed_as_blocked_and_never_imported():
    found = listing({"TRAINER_PLUGINS_BLOCK": "broken_import,tp-fixture-raising-hook"})
    plugins = {plugin["name"]: plugin for plugin in found["plugins"]}
    assert (plugins["broken_import"]["state"], plugins["broken_import"]["reason"]) == (
        "blocked",
        "blocked by TRAINER_PLUGINS_BLOCK (broken-import)",
    )
    assert plugins["raising_hook"]["reason"] == "blocked by TRAINER_PLUGINS_BLOCK (tp-fixture-raising-hook)"
    assert "libnpu.so" not in found["stderr"]


def test_lightning_and_unrelated_plugins_keep_working():
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="local_sgd", logger=False)
    assert type(trainer.strategy).__name__ == "LocalSGDStrategy"
    assert type(L.Trainer(accelerator="cpu", logger=False).strategy).__name__ == "SingleDeviceStrategy"


def test_selecting_a_plugin_whose_hook_raised_names_its_distribution_version_and_error():
    with pytest.raises(
        PluginError, match=r"raising_hook \(tp-fixture-raising-hook 0\.2\.0\) cannot provide accelerator 'npu'"
    ) as info:
        L.Trainer(accelerator="npu", logger=False)
    assert "RuntimeError: strategy table corrupted" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("future_npu", "wrong_api (tp-fixture-wrong-api 0.3.0): supports hookspec API >=2.0,<3"),
        (
            "libnpu",
            "broken_import (tp-fixture-broken-import 0.1.0): import of 'broken_import_plugin' failed: ImportError",
        ),
    ],
)
def test_a_name_of_a_plugin_that_never_loaded_is_unknown_and_the_error_names_the_quarantined_plugins(name, expected):
    with pytest.raises(ValueError, match=f"You selected an invalid accelerator name: `accelerator={name!r}`") as info:
        L.Trainer(accelerator=name, logger=False)
    assert expected in str(info.value)


def test_selecting_a_contested_name_names_both_distributions():
    with pytest.raises(PluginConflictError, match=r"tp-fixture-twin-a 1\.0\.0\), twin_b \(tp-fixture-twin-b 1\.0\.0\)"):
        L.Trainer(accelerator="cpu", strategy="twin", logger=False)


def test_the_quarantine_is_in_the_process_wide_plugin_set():
    records = trainer_plugins.get_plugin_manager().records
    quarantined = {name for name, record in records.items() if record.state == "quarantined"}
    # wrong_kind is quarantined by the first run whose decision hooks it answers wrongly
    assert quarantined - {"wrong_kind"} == {"broken_import", "raising_hook", "wrong_api", "exit_at_import"}
