"""The `trainer-plugins` console command: list, doctor, explain."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version

import pytest
from conftest import HAS_TORCH_XLA


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = shutil.which("trainer-plugins", path=os.path.dirname(sys.executable))
    assert command, "the console script is installed next to the interpreter"
    return subprocess.run(
        [command, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def test_list_shows_each_plugin_its_distribution_state_and_names():
    result = cli("list")
    assert result.returncode == 0
    assert f"xla  [xla-plugins {version('xla-plugins')}]  loaded" in result.stdout
    assert "    strategy: single_xla, single_tpu (deprecated), xla, xla_debug, xla_spmd" in result.stdout
    assert "accelerator 'tpu' is claimed by lightning" in result.stdout  # the XLA plugin's override, reported


def test_explain_gives_the_decisions_as_json():
    result = cli("--json", "explain", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp")
    assert result.returncode == 0, result.stderr
    rows = {row["role"]: row for row in json.loads(result.stdout)}
    assert rows["strategy"]["choice"] == "ddp (lightning.pytorch.strategies.ddp.DDPStrategy)"
    assert rows["is_distributed"] == {
        "role": "is_distributed",
        "choice": "True",
        "plugin": "trainer-plugins",
        "reason": "whitelisted distributed strategy",
    }


def test_explain_reports_rejected_flags_with_exit_status_1():
    result = cli("explain", "--accelerator", "cpu", "--strategy", "warp_drive")
    assert result.returncode == 1
    assert "error: ValueError: Unknown strategy name `strategy='warp_drive'`" in result.stderr


@pytest.mark.skipif(not HAS_TORCH_XLA, reason="describes the XLA runtime")
def test_doctor_describes_the_xla_runtime():
    result = cli("--json", "doctor", env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"})
    assert result.returncode == 0, result.stderr
    backends = json.loads(result.stdout)["backends"]
    xla = backends[f"xla (xla-plugins {version('xla-plugins')})"]
    assert xla == {
        "torch": version("torch"),
        "torch_xla": version("torch_xla"),
        "PJRT_DEVICE": "CPU",
        "runtime": "PJRT",
        "device type": "CPU",
        "device count": 4,
    }
    assert backends[f"lightning (lightning {version('lightning')})"]["lightning"] == version("lightning")


def test_usage_errors_exit_with_status_2():
    assert cli("frobnicate").returncode == 2
