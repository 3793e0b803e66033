"""Where no plugin is involved, Lightning behaves as without trainer-plugins: its error wording, no backend touched."""

from __future__ import annotations

import json

import pytest
from conftest import run_python

L = pytest.importorskip("lightning")
from lightning.fabric.connector import _Connector  # noqa: E402
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector  # noqa: E402


def lightnings_own_error(connector_class: type, **flags) -> str:
    """The message plain Lightning's connector raises for ``flags``."""
    with pytest.raises(ValueError) as info:
        connector_class(**flags)
    return str(info.value)


def plugin_names(role: str, api: str, lightning_names: list[str]) -> list[str]:
    import trainer_plugins

    names = trainer_plugins.get_catalog().names(role, api, include_deprecated=True)
    return [name for name in names if name not in lightning_names]


@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_an_invalid_accelerator_name_keeps_lightnings_message_with_plugin_names_appended_once(api):
    lightning_class, build = {
        "trainer": (_AcceleratorConnector, lambda **f: L.Trainer(logger=False, **f)),
        "fabric": (_Connector, L.Fabric),
    }[api]
    plain = lightnings_own_error(lightning_class, accelerator="invalid")
    assert plain.startswith("You selected an invalid accelerator name: `accelerator='invalid'`. Available names are: ")
    lightning_names = plain.removesuffix(".").split("Available names are: ")[1].split(", ")
    added = plugin_names("accelerator", api, lightning_names)
    assert "xla" in added
    with pytest.raises(ValueError) as info:
        build(accelerator="invalid")
    assert str(info.value) == f"{plain.removesuffix('.')}, {', '.join(added)}."
    listed = str(info.value).split("Available names are: ")[1].removesuffix(".").split(", ")
    assert len(listed) == len(set(listed))


def test_an_invalid_strategy_name_keeps_lightnings_message_and_appends_the_plugin_strategies():
    plain = lightnings_own_error(_AcceleratorConnector, strategy="invalid")
    with pytest.raises(ValueError) as info:
        L.Trainer(strategy="invalid", logger=False)
    message = str(info.value)
    assert message.startswith(plain)
    appended = message[len(plain) :]
    assert appended.startswith(" Strategies from installed plugins: ")
    names = appended.removeprefix(" Strategies from installed plugins: ").removesuffix(".").split(", ")
    assert "xla_spmd" in names and len(names) == len(set(names))
    assert not {"xla", "single_xla", "ddp"} & set(names)  # Lightning's own names are not repeated


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_rejecting_a_name_imports_no_backend_and_leaves_no_environment_variable():
    result = run_python(
        """
        import json, os, sys
        import lightning as L
        before = dict(os.environ)
        errors = []
        for build, flags in ((L.Trainer, {"accelerator": "invalid"}), (L.Trainer, {"strategy": "invalid"}),
                             (L.Fabric, {"accelerator": "invalid"}), (L.Fabric, {"strategy": "invalid"})):
            try:
                build(**flags)
            except ValueError as error:
                errors.append(str(error).split(":")[0])
        print(json.dumps({"errors": errors, "imported": [m for m in ("torch_xla", "libtpu") if m in sys.modules],
                          "new_variables": sorted(set(os.environ) - set(before)),
                          "changed": sorted(k for k in before if os.environ.get(k) != before[k])}))
        """,
        env={"PJRT_DEVICE": None, "PJRT_DYNAMIC_PLUGINS": None, "TRAINER_PLUGINS_AUTOLOAD": None},
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {
        "errors": ["You selected an invalid accelerator name", "You selected an invalid strategy name"] * 2,
        "imported": [],
        "new_variables": [],
        "changed": [],
    }


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
@pytest.mark.xla
def test_a_stubbed_torch_xla_makes_the_xla_plugin_not_available_without_error_or_quarantine():
    """A ``torch_xla`` stand-in without ``__spec__`` (as suites faking a TPU install) means "not available"."""
    result = run_python(
        """
        import json, sys, types
        import lightning as L
        import trainer_plugins
        report = {}
        sys.modules["torch_xla"] = types.ModuleType("torch_xla")
        report["auto"] = type(L.Trainer(accelerator="auto", logger=False).accelerator).__name__
        try:
            L.Trainer(accelerator="tpu", devices=1, logger=False)
        except Exception as error:
            report["tpu_with_stub"] = [type(error).__name__, str(error)]
        report["state"] = trainer_plugins.get_plugin_manager().records["xla"].state
        del sys.modules["torch_xla"]
        report["tpu_after"] = type(L.Trainer(accelerator="tpu", devices=1, logger=False).strategy).__module__
        print(json.dumps(report))
        """,
        env={"PJRT_DEVICE": None},
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["auto"] == "CPUAccelerator"
    kind, message = report["tpu_with_stub"]  # selecting it says what is wrong, and quarantines nothing
    assert kind == "ModuleNotFoundError" and "quarantined" not in message
    assert message.endswith(
        "The XLA plugin needs torch_xla, but sys.modules['torch_xla'] is a stand-in without __spec__ (a stub)."
    )
    assert report["state"] == "loaded"
    assert report["tpu_after"] == "xla_plugins.strategies.single_xla"


def test_a_single_device_strategy_instance_with_several_devices_is_accepted_as_lightning_does():
    """Lightning's own test_custom_accelerator builds this; only a strategy *name* with several devices is refused."""
    import torch
    from lightning.pytorch.strategies import SingleDeviceStrategy

    strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    trainer = L.Trainer(accelerator="cpu", strategy=strategy, devices=2, logger=False)
    assert trainer.strategy is strategy
