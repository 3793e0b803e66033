"""The private Lightning names trainer-plugins relies on exist, and an untested Lightning is never silently bypassed."""

from __future__ import annotations

import importlib.util
import json
from importlib.metadata import version

import pytest
from conftest import run_python

from trainer_plugins._lightning_contract import ATTRIBUTES, METHODS, contract_violations

PACKAGES = [
    pytest.param(package, marks=pytest.mark.skipif(importlib.util.find_spec(package) is None, reason="not installed"))
    for package in ("lightning", "pytorch_lightning")
]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_private_lightning_name_we_rely_on_exists_with_the_expected_signature(package):
    """Runs in every tox environment, so on every Lightning version of the matrix."""
    assert contract_violations(package) == [], f"Lightning {version('lightning')}"


def test_the_contract_names_the_adapters_overrides_and_the_replaced_module_names():
    methods = {method.path.split(".")[-1] for method in METHODS}
    assert {
        "_check_config_and_set_final_flags",
        "_init_strategy",
        "_lazy_init_strategy",
        "_prepare_dataloader",
    } <= methods
    assert ("lightning.pytorch.trainer.trainer:", "_AcceleratorConnector") in ATTRIBUTES


def test_a_renamed_private_method_is_reported(monkeypatch):
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    monkeypatch.delattr(_AcceleratorConnector, "_choose_strategy")
    assert contract_violations("lightning") == [
        "lightning.pytorch.trainer.connectors.accelerator_connector:_AcceleratorConnector._choose_strategy: missing"
        " (AttributeError: type object '_AcceleratorConnector' has no attribute '_choose_strategy')"
    ]


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_a_lightning_outside_the_tested_range_warns_once_is_left_alone_and_refuses_plugin_names():
    result = run_python(
        """
        import json, warnings
        import trainer_plugins._attach as attaching
        attaching._lightning_version = lambda package: "2.99.0"
        report = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import lightning as L
            trainer = L.Trainer(accelerator="cpu", logger=False)
            L.Trainer(accelerator="cpu", logger=False)
        report["warnings"] = [str(w.message) for w in caught if "trainer-plugins" in str(w.message)]
        report["connector"] = type(trainer._accelerator_connector).__module__
        report["plugin_aware"] = hasattr(trainer._accelerator_connector, "plugin_connector")
        for flags in ({"accelerator": "xla"}, {"accelerator": "cpu", "strategy": "xla_spmd"}):
            try:
                L.Trainer(logger=False, **flags)
            except ValueError as error:
                report.setdefault("errors", []).append(str(error))
        print(json.dumps(report))
        """,
        env={"TRAINER_PLUGINS_AUTOLOAD": None},
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert len(report["warnings"]) == 1
    assert report["warnings"][0].startswith(
        "trainer-plugins is tested with lightning<2.7,>=2.5, but lightning 2.99.0 is installed: trainer-plugins"
        " leaves lightning alone"
    )
    assert report["connector"] == "lightning.pytorch.trainer.connectors.accelerator_connector"
    assert report["plugin_aware"] is False
    accelerator_error, strategy_error = report["errors"]
    assert accelerator_error.startswith("You selected an invalid accelerator name: `accelerator='xla'`.")
    assert "The accelerator 'xla' comes from plugin xla (xla-plugins" in accelerator_error
    assert accelerator_error.endswith(
        "which cannot attach to this Lightning version: trainer-plugins is tested with"
        " lightning<2.7,>=2.5, but lightning 2.99.0 is installed."
    )
    assert "The strategy 'xla_spmd' comes from plugin xla (xla-plugins" in strategy_error


@pytest.mark.parametrize("package", PACKAGES)
def test_every_private_lightning_name_the_xla_plugin_relies_on_exists_with_the_expected_signature(package):
    """The XLA plugin's own contract (``xla_plugins._lightning_contract``), on every Lightning of the matrix."""
    from xla_plugins import _lightning_contract as xla_contract

    assert contract_violations(package, xla_contract.METHODS, xla_contract.ATTRIBUTES) == [], (
        f"Lightning {version('lightning')}"
    )


def test_the_xla_plugins_contract_lists_every_private_lightning_name_its_modules_import():
    """Reads the plugin's sources: a new ``from lightning... import _name`` must be added to the contract."""
    import ast
    from pathlib import Path

    import xla_plugins
    from xla_plugins import _lightning_contract as xla_contract

    listed = {(attribute.path, attribute.name) for attribute in xla_contract.ATTRIBUTES}
    imported = set()
    for source in Path(xla_plugins.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lightning":
                imported |= {(f"{node.module}:", alias.name) for alias in node.names if alias.name.startswith("_")}
    assert imported <= listed
    assert ("lightning.pytorch.trainer.connectors.logger_connector.result:", "_ResultCollection") in imported
