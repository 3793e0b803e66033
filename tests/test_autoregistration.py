"""An unchanged Lightning script gets the XLA plugin's classes after `pip install xla-plugins`."""

from __future__ import annotations

import json

import pytest
from conftest import run_python

pytestmark = pytest.mark.xla

UNCHANGED_SCRIPT = """
import json
import lightning as L

def names(trainer):
    objects = (trainer.accelerator, trainer.strategy, trainer.precision_plugin,
               trainer._accelerator_connector.cluster_environment)
    return [f"{type(o).__module__}.{type(o).__qualname__}" for o in objects]

print(json.dumps({name: names(L.Trainer(accelerator=name, devices=1, precision="bf16-true", logger=False))
                  for name in ("tpu", "xla")}))
"""

OURS = [
    "xla_plugins.accelerator.XLAAccelerator",
    "xla_plugins.strategies.single_xla.SingleDeviceXLAStrategy",
    "xla_plugins.precision.XLAPrecision",
    "xla_plugins.environment.XLAEnvironment",
]


def test_fresh_interpreter_running_an_unchanged_script_gets_the_xla_plugin_classes():
    result = run_python(UNCHANGED_SCRIPT, env={"TRAINER_PLUGINS_AUTOLOAD": None})
    assert json.loads(result.stdout.splitlines()[-1]) == {"tpu": OURS, "xla": OURS}


def test_with_autoload_off_lightning_is_untouched_until_install_is_called():
    result = run_python(
        """
        import lightning as L
        from lightning.pytorch.trainer import trainer as trainer_module
        print("connector:", trainer_module._AcceleratorConnector.__module__)
        try:
            L.Trainer(accelerator="xla")
        except ValueError as error:
            print("xla rejected:", "invalid accelerator name" in str(error))
        try:
            L.Trainer(accelerator="tpu", devices=1)
        except Exception as error:  # Lightning's own XLAAccelerator finds no TPU here
            print("tpu:", type(error).__name__, "XLAAccelerator" in str(error))
        import trainer_plugins
        trainer_plugins.install()
        print("after install:", type(L.Trainer(accelerator="xla", devices=1, logger=False).accelerator).__module__)
        """,
        env={"TRAINER_PLUGINS_AUTOLOAD": "0"},
    )
    lines = result.stdout.splitlines()
    assert "connector: lightning.pytorch.trainer.connectors.accelerator_connector" in lines
    assert "xla rejected: True" in lines
    assert "tpu: MisconfigurationException True" in lines
    assert "after install: xla_plugins.accelerator" in lines


def test_the_trainer_logs_which_plugin_supplied_each_role_at_start_up(caplog):
    import logging

    import lightning as L

    with caplog.at_level(logging.INFO):
        L.Trainer(accelerator="tpu", devices=1, logger=False)
    (line,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("trainer-plugins: ")]
    assert line.startswith("trainer-plugins: accelerator=xla [xla (xla-plugins ")
    assert "strategy=single_xla [xla (xla-plugins" in line and "is_distributed=False [trainer-plugins]" in line
