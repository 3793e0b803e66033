"""The standalone packages ``pytorch_lightning`` and ``lightning_fabric`` get the plugins as ``lightning`` does.

One fresh interpreter (no import of ours in the script) runs every scenario; each test checks one
behaviour of its report.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_python

pytest.importorskip("pytorch_lightning")
pytestmark = pytest.mark.xla

SCRIPT = """
import json, sys
import torch
import pytorch_lightning as pl
import lightning_fabric
from pytorch_lightning.demos.boring_classes import BoringModel

def roles(trainer):
    objects = {"accelerator": trainer.accelerator, "strategy": trainer.strategy,
               "precision": trainer.precision_plugin,
               "environment": trainer._accelerator_connector.cluster_environment}
    return {role: f"{type(o).__module__}.{type(o).__qualname__}" for role, o in objects.items()}

def bases_hold(trainer, package):
    import importlib
    pytorch = importlib.import_module(package)
    fabric = importlib.import_module("lightning_fabric" if package == "pytorch_lightning" else "lightning.fabric")
    return [isinstance(trainer.accelerator, pytorch.accelerators.XLAAccelerator),
            isinstance(trainer.strategy, pytorch.strategies.SingleDeviceXLAStrategy),
            isinstance(trainer.precision_plugin, pytorch.plugins.precision.XLAPrecision),
            isinstance(trainer._accelerator_connector.cluster_environment, fabric.plugins.environments.XLAEnvironment)]

report = {}
flags = dict(accelerator="tpu", devices=1, precision="bf16-true", max_steps=2, logger=False,
             enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1])
trainer = pl.Trainer(**flags)
trainer.fit(BoringModel())
record = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False).get("trainer_plugins")
report["pl"] = {"roles": roles(trainer), "bases": bases_hold(trainer, "pytorch_lightning"),
                "steps": trainer.global_step, "record": [d["role"] for d in (record or {}).get("decisions", [])],
                "lightning_imported_first": "lightning" in sys.modules}

fabric = lightning_fabric.Fabric(accelerator="tpu", devices=1)
report["fabric"] = {"strategy": isinstance(fabric.strategy, lightning_fabric.strategies.SingleDeviceXLAStrategy),
                    "accelerator": type(fabric.accelerator).__module__,
                    "device": str(fabric.device)}

import lightning as L
unified = L.Trainer(accelerator="tpu", devices=1, logger=False)
report["both"] = {"unified": roles(unified), "unified_bases": bases_hold(unified, "lightning.pytorch"),
                  "pl_again": roles(pl.Trainer(accelerator="tpu", devices=1, logger=False)),
                  "pl_cpu": type(pl.Trainer(accelerator="cpu", logger=False).strategy).__module__}

import xla_plugins.roles.accelerator as ours
twin = type(trainer.accelerator)
source = ours.XLAAccelerator.parse_devices.__code__.co_filename
report["one_source"] = [twin.parse_devices.__code__.co_filename == source, twin is not ours.XLAAccelerator]
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standalone")
    result = run_python(SCRIPT.replace("sys.argv[1]", repr(str(tmp))), env={"TRAINER_PLUGINS_AUTOLOAD": None})
    return json.loads(result.stdout.splitlines()[-1])


TWIN = "trainer_plugins._standalone.xla_plugins."


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_pytorch_lightning_trainer_tpu_fits_on_pjrt_cpu_with_the_xla_plugin(report):
    assert report["pl"]["roles"] == {
        "accelerator": TWIN + "roles.accelerator.XLAAccelerator",
        "strategy": TWIN + "strategies.single_xla.SingleDeviceXLAStrategy",
        "precision": TWIN + "roles.precision.XLAPrecision",
        "environment": TWIN + "roles.environment.XLAEnvironment",
    }
    assert report["pl"]["steps"] == 2


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_the_classes_handed_to_pytorch_lightning_are_instances_of_its_own_base_classes(report):
    assert report["pl"]["bases"] == [True, True, True, True]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_pytorch_lightning_checkpoint_carries_the_plugin_record(report):
    assert report["pl"]["record"] == [
        "accelerator",
        "devices",
        "environment",
        "strategy",
        "precision",
        "is_distributed",
    ]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_lightning_fabric_fabric_gets_the_xla_plugin(report):
    assert report["fabric"] == {
        "strategy": True,
        "accelerator": TWIN + "roles.accelerator",
        "device": "xla:0",
    }


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_both_packages_in_one_process_each_get_classes_of_their_own(report):
    assert report["both"]["unified"] == {
        "accelerator": "xla_plugins.roles.accelerator.XLAAccelerator",
        "strategy": "xla_plugins.strategies.single_xla.SingleDeviceXLAStrategy",
        "precision": "xla_plugins.roles.precision.XLAPrecision",
        "environment": "xla_plugins.roles.environment.XLAEnvironment",
    }
    assert report["both"]["unified_bases"] == [True, True, True, True]
    assert report["both"]["pl_again"] == report["pl"]["roles"]
    assert report["both"]["pl_cpu"] == "pytorch_lightning.strategies.single_device"


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_one_implementation_serves_both_packages(report):
    """The pytorch_lightning classes run the plugin's one source file, built on the other package's bases."""
    assert report["one_source"] == [True, True]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_pytorch_lightning_cli_selects_the_xla_plugin(tmp_path):
    result = run_python(
        f"""
        import sys
        from pytorch_lightning.cli import LightningCLI
        from pytorch_lightning.demos.boring_classes import BoringModel, BoringDataModule
        sys.argv = ["cli", "--trainer.accelerator=tpu", "--trainer.devices=1", "--trainer.max_steps=1",
                    "--trainer.logger=false", "--trainer.default_root_dir={tmp_path}"]
        cli = LightningCLI(BoringModel, BoringDataModule, run=False)
        print("strategy:", type(cli.trainer.strategy).__module__)
        """
    )
    assert "strategy: trainer_plugins._standalone.xla_plugins.strategies.single_xla" in result.stdout.splitlines()
