"""torchtpu-plugins' torch backend autoload entry point: off and free by default, the stand-in when asked.

Each test runs a fresh interpreter (the entry point runs at ``import torch``), with
TORCHTPU_PLUGINS_DEVICE set or unset for it alone.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_python

pytestmark = pytest.mark.torchtpu

_REPORT = """
import json, sys
import torch
print(json.dumps({
    "modules": sorted(name for name in sys.modules if name.split(".")[0] == "torchtpu_plugins"),
    "privateuse1": torch._C._get_privateuse1_backend_name(),
    "accelerator": str(torch.accelerator.current_accelerator()),
}))
"""


def test_entry_point_runs_but_does_nothing_without_the_variable():
    report = json.loads(run_python(_REPORT, env={"TORCHTPU_PLUGINS_DEVICE": None}).stdout.splitlines()[-1])
    # torch imported the entry point's module (and so its package), and that is all it cost
    assert report["modules"] == ["torchtpu_plugins", "torchtpu_plugins._autoload"]
    assert report["privateuse1"] == "privateuseone"
    assert report["accelerator"] != "tpu"  # None with torch's CPU build, "cuda" with its CUDA build (torch 2.11 here)


def test_entry_point_imports_nothing_beyond_its_module():
    # torch's autoload off, so that nothing of ours is loaded before `before`; then what torch would run
    code = """
    import sys, torch
    before = set(sys.modules)
    from torchtpu_plugins._autoload import load
    load()
    print(sorted(set(sys.modules) - before))
    """
    env = {"TORCHTPU_PLUGINS_DEVICE": None, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    assert run_python(code, env=env).stdout.splitlines()[-1] == "['torchtpu_plugins', 'torchtpu_plugins._autoload']"


def test_variable_installs_the_standin_at_import_torch():
    code = _REPORT + 'print(torch.ones(2, device="tpu").device, flush=True)'
    lines = run_python(code, env={"TORCHTPU_PLUGINS_DEVICE": "cpu"}).stdout.splitlines()
    report = json.loads(lines[-2])
    assert report["privateuse1"] == "tpu" and report["accelerator"] == "tpu"
    assert "torchtpu_plugins.standin" in report["modules"]
    assert lines[-1] == "tpu:0"


def test_unknown_value_fails_import_torch_naming_the_valid_ones():
    result = run_python("import torch", env={"TORCHTPU_PLUGINS_DEVICE": "gpu"}, check=False)
    assert result.returncode != 0
    assert "TORCHTPU_PLUGINS_DEVICE='gpu' is not a valid value; valid values: cpu" in result.stderr
    assert "Failed to load the backend extension: torchtpu_plugins_standin" in result.stderr


def test_refuses_when_another_backend_holds_privateuse1():
    code = """
    import torch
    torch.utils.rename_privateuse1_backend("npu")
    from torchtpu_plugins.standin import install
    try:
        install()
    except RuntimeError as error:
        print(error)
    print(torch._C._get_privateuse1_backend_name(), hasattr(torch, "tpu"))
    """
    lines = run_python(code, env={"TORCHTPU_PLUGINS_DEVICE": None}).stdout.splitlines()
    assert "PrivateUse1 is held by the backend 'npu' already" in lines[-2]
    assert lines[-1] == "npu False"
