"""An unchanged Lightning script gets the XLA plugin's classes after `pip install xla-plugins`."""

from __future__ import annotations

import json
import logging
from importlib.metadata import version

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
    "xla_plugins.roles.accelerator.XLAAccelerator",
    "xla_plugins.strategies.single_xla.SingleDeviceXLAStrategy",
    "xla_plugins.roles.precision.XLAPrecision",
    "xla_plugins.roles.environment.XLAEnvironment",
]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_fresh_interpreter_running_an_unchanged_script_gets_the_xla_plugin_classes():
    result = run_python(UNCHANGED_SCRIPT, env={"TRAINER_PLUGINS_AUTOLOAD": None})
    assert json.loads(result.stdout.splitlines()[-1]) == {"tpu": OURS, "xla": OURS}


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
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
    assert "after install: xla_plugins.roles.accelerator" in lines


def _startup_lines(caplog, level=logging.INFO, **flags):
    """What a Trainer built with ``flags`` logs from trainer-plugins."""
    import lightning as L

    caplog.clear()
    with caplog.at_level(level), caplog.at_level(level, logger="trainer_plugins"):
        L.Trainer(logger=False, **flags)
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith("trainer-plugins")]


def test_the_trainer_logs_one_short_line_when_a_plugin_supplies_a_role(caplog):
    (line,) = _startup_lines(caplog, accelerator="tpu", devices=1)
    assert len(line) <= 120, line
    assert line == (
        "trainer-plugins: accelerator=xla, environment=xla, strategy=single_xla, precision=xla"
        f" from xla-plugins {version('xla-plugins')}"
    )


def test_the_trainer_logs_nothing_when_lightning_supplies_every_role(caplog):
    assert _startup_lines(caplog, accelerator="cpu", devices=1) == []


def test_the_full_table_is_logged_at_debug_level(caplog):
    lines = _startup_lines(caplog, logging.DEBUG, accelerator="cpu", devices=2, strategy="ddp")
    (table,) = [line for line in lines if line.startswith("trainer-plugins resolved the run:")]
    assert "is_distributed  True  <- trainer-plugins: one of Lightning's distributed strategy classes" in table
