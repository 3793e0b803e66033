"""A plugin cannot break a run it is not part of (tox environment `platform`).

Installed there from tests/fixtures/, next to the working plugins: a plugin whose probe never
answers, one that calls sys.exit() at import, one whose declared class cannot be imported, one whose
is_available() raises, one whose decision hooks answer with the wrong kind of object, one that
prints and one that changes os.environ at import. A plain Trainer and a CPU fit run; selecting each
plugin gives an error naming it and its distribution; `trainer-plugins list`/`doctor` work, in text
and JSON. The tox environment sets TRAINER_PLUGINS_PROBE_TIMEOUT=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from importlib.metadata import distribution

import pytest
from plugin_helpers import require_fixture_plugins

require_fixture_plugins("tp-fixture-hanging-probe", "isolation fixture plugins")

L = pytest.importorskip("lightning")
from lightning.pytorch.accelerators import CPUAccelerator  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402
from lightning.pytorch.plugins.precision import Precision  # noqa: E402
from lightning.pytorch.strategies import SingleDeviceStrategy  # noqa: E402

import trainer_plugins  # noqa: E402
from trainer_plugins import PluginError  # noqa: E402


def test_a_plain_trainer_and_a_cpu_fit_run_beside_every_broken_plugin():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = L.Trainer(logger=False, enable_checkpointing=False, max_steps=2, enable_progress_bar=False)
        trainer.fit(BoringModel())
    assert type(trainer.accelerator) is CPUAccelerator
    assert type(trainer.strategy) is SingleDeviceStrategy
    assert type(trainer.precision_plugin) is Precision
    assert trainer.global_step == 2
    messages = [str(w.message) for w in caught]
    for label in (
        "hanging_probe (tp-fixture-hanging-probe 0.1.0)",
        "missing_class (tp-fixture-missing-class 0.1.0)",
        "raising_available (tp-fixture-raising-available 0.1.0)",
    ):
        assert any(f"plugin {label} is not available for this run" in m for m in messages), (label, messages)
    assert trainer_plugins.get_plugin_manager().records["wrong_kind"].state == "quarantined"
    assert "TRAINER_PLUGINS_PIN_ACCELERATOR" not in os.environ  # the environ_mutating plugin's rewrite was undone


@pytest.mark.parametrize(
    ("accelerator", "error", "expected"),
    [
        (
            "wedged",
            PluginError,
            r"plugin hanging_probe \(tp-fixture-hanging-probe 0\.1\.0\) cannot provide"
            r" accelerator 'wedged': failed in trainer_plugins_accelerator_available: ProbeTimeout",
        ),
        (
            "licensed",
            ValueError,
            r"exit_at_import \(tp-fixture-exit-at-import 0\.1\.0\): import of"
            r" 'exit_at_import_plugin' failed: SystemExit: exit_at_import: no license server",
        ),
        (
            "ghost",
            PluginError,
            r"plugin missing_class \(tp-fixture-missing-class 0\.1\.0\) cannot provide"
            r" accelerator 'ghost': ModuleNotFoundError: No module named 'ghost_driver'",
        ),
        (
            "flaky",
            PluginError,
            r"plugin raising_available \(tp-fixture-raising-available 0\.1\.0\) cannot provide"
            r" accelerator 'flaky': failed in FlakyAccelerator.is_available\(\): RuntimeError: flaky driver",
        ),
        (
            "wrongkind",
            PluginError,
            r"plugin wrong_kind \(tp-fixture-wrong-kind 0\.1\.0\).* returned the string 'slurm'",
        ),
        ("loud", RuntimeError, r"^plugin printing \(tp-fixture-printing 0\.1\.0\): no loud device attached$"),
        ("meddler", RuntimeError, r"^plugin environ_mutating \(tp-fixture-environ-mutating 0\.1\.0\): no meddler"),
    ],
)
def test_selecting_a_broken_plugin_names_it_and_its_distribution(accelerator, error, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error, match=expected):
            L.Trainer(accelerator=accelerator, logger=False)


def test_a_quarantined_plugin_does_not_change_how_cpu_runs_pick_their_strategy():
    # raising_hook declared 'npu' -> Lightning's CPUAccelerator before its strategies hook raised
    trainer = L.Trainer(accelerator="cpu", logger=False)
    decisions = trainer._accelerator_connector.plugin_connector.explanation.as_dicts()
    assert [d["plugin"] for d in decisions if d["role"] == "accelerator"] == [
        f"lightning (lightning {distribution('lightning').version})"
    ]
    assert type(trainer.strategy) is SingleDeviceStrategy


def test_import_side_effects_are_recorded_by_plugin():
    trainer_plugins.get_catalog()
    records = trainer_plugins.get_plugin_manager().records
    assert records["printing"].output == "printing plugin: hello from import\nprinting plugin: declaring accelerators\n"
    assert records["environ_mutating"].environ_changes == {
        "MEDDLER_HOME": (None, "/opt/meddler"),
        "PJRT_DEVICE": ("CPU", "TPU"),
        "TRAINER_PLUGINS_PIN_ACCELERATOR": (None, "meddler"),
    }


def cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "trainer_plugins._cli", *args], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


def test_list_in_text_and_json_works_and_json_output_is_clean():
    text = cli("list").stdout
    assert "exit_at_import  [tp-fixture-exit-at-import 0.1.0]  quarantined" in text
    assert "printing plugin:" not in text
    listing = json.loads(cli("--json", "list").stdout)
    assert {p["name"] for p in listing["plugins"]} >= {"hanging_probe", "printing", "environ_mutating", "wrong_kind"}


def test_doctor_in_text_and_json_reports_probes_prints_and_environment_changes():
    text = cli("doctor").stdout
    assert "printed at import: printing plugin: hello from import" in text
    report = json.loads(cli("--json", "doctor").stdout)
    assert report["availability"]["wedged"].startswith(
        "not available: failed in trainer_plugins_accelerator_available:"
    )
    assert report["availability"]["flaky"] == (
        "not available: failed in FlakyAccelerator.is_available(): RuntimeError: flaky driver: device query failed"
    )
    assert "cpu" not in report["availability"]  # Lightning's own accelerators are not probed by doctor
    effects = report["side effects"]["environ_mutating (tp-fixture-environ-mutating 0.1.0)"]
    assert "TRAINER_PLUGINS_PIN_ACCELERATOR: unset -> 'meddler' (undone" in effects["changed os.environ at import"]
    assert "exit_at_import (tp-fixture-exit-at-import 0.1.0)" in report["quarantined"]


def test_a_cpu_fit_in_a_fresh_process_is_unaffected():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import lightning as L; t = L.Trainer(logger=False); print(type(t.accelerator).__name__)",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "CPUAccelerator"
    assert "printing plugin" not in result.stdout
