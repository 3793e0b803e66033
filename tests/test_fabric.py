"""lightning.Fabric goes through the same plugins, with the same validation, on PJRT CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest

pytestmark = pytest.mark.xla

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from torch import nn  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "fabric_digits.py"


def fabric_run(strategy: str, devices: int, precision: str, out: Path) -> list[dict]:
    """Run the script; each rank's report (one file per rank: replica threads share one stdout)."""
    from xla_cpu_harness import required_environment

    env = {**os.environ, **required_environment(devices)}
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *("--strategy", strategy, "--devices", str(devices), "--precision", precision, "--out", str(out)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return sorted((json.loads(path.read_text()) for path in out.glob("rank*.json")), key=lambda r: r["rank"])


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize(
    ("strategy", "devices", "precision", "expected_class", "world_size", "dtype"),
    [
        ("auto", 1, "bf16-true", "single_xla.FabricSingleDeviceXLAStrategy", 1, "torch.bfloat16"),
        pytest.param(
            "auto", 2, "32-true", "xla_spmd.FabricXLASPMDStrategy", 1, "torch.float32", marks=pytest.mark.slow
        ),
        pytest.param(  # with tests/xla_cpu_harness.py
            "xla", 2, "32-true", "xla.FabricXLAStrategy", 2, "torch.float32", marks=pytest.mark.slow
        ),
    ],
)
def test_a_fabric_loop_trains_the_digits_classifier(
    strategy, devices, precision, expected_class, world_size, dtype, tmp_path
):
    reports = fabric_run(strategy, devices, precision, tmp_path)
    assert [report["rank"] for report in reports] == list(range(world_size))
    for report in reports:
        assert report["strategy"] == f"xla_plugins.strategies.{expected_class}"
        assert (report["precision"], report["accelerator"], report["dtype"]) == (
            "FabricXLAPrecision",
            "xla_plugins.roles.accelerator",
            dtype,
        )
        assert report["world_size"] == world_size
        assert report["accuracy"] > 0.9
    assert len({report["accuracy"] for report in reports}) == 1  # every rank saw the same all-reduced count


def test_fabric_precision_steps_through_torch_xla_optimizer_step_with_a_barrier():
    import torch_xla.core.xla_model as xm

    fabric = L.Fabric(accelerator="xla", devices=1, precision="bf16-true")
    module = nn.Linear(4, 2)
    try:
        model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
        assert "XLA_USE_BF16" not in os.environ  # the dtype conversion does the work, no legacy variable
        before = model.weight.detach().cpu().clone()
        fabric.backward(model(torch.randn(3, 4, device=fabric.device)).sum())
        with mock.patch.object(xm, "optimizer_step", wraps=xm.optimizer_step) as step:
            optimizer.step()
        assert step.call_args.kwargs["barrier"] is True
        assert not torch.equal(model.weight.detach().cpu(), before)  # the step reached the parameters on the device
    finally:
        fabric.strategy.teardown()
    assert "XLA_USE_BF16" not in os.environ


def test_fabric_optimizers_follow_the_parameters_to_the_device():
    fabric = L.Fabric(accelerator="xla", devices=1)
    module = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    model, optimizer = fabric.setup(module, optimizer)
    assert [p.device.type for group in optimizer.param_groups for p in group["params"]] == ["xla", "xla"]
    assert {id(p) for p in model.parameters()} == {id(p) for group in optimizer.param_groups for p in group["params"]}


@pytest.mark.parametrize(
    ("flags", "error", "message"),
    [
        (dict(precision="16-mixed"), ValueError, "`precision='16-mixed'` is not supported on XLA"),
        (dict(precision="bf16"), ValueError, "`precision='bf16'` is not supported on XLA"),
        (dict(devices=3), ValueError, "`devices` can only be 'auto', 1 or [0] for XLA, got 3. The PJRT runtime"),
        (
            dict(devices=None),
            TypeError,
            "`devices` for XLA must be 'auto', an int, a string or a list of ints, got None",
        ),
        (dict(strategy="ddp"), ValueError, "The XLA accelerator cannot run strategy DDPStrategy"),
        (dict(strategy="warp"), ValueError, "You selected an invalid strategy name: `strategy='warp'`"),
    ],
)
def test_fabric_validates_devices_precision_and_strategies_like_the_trainer(flags, error, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error) as info:
            L.Fabric(accelerator="tpu", **{"devices": 1, **flags})
    assert message in str(info.value)


def test_fabric_is_attached_automatically():
    import trainer_plugins

    assert trainer_plugins.installed()
    assert type(L.Fabric(accelerator="tpu", devices=1)._connector).__name__ == "FabricConnector"


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_a_fabric_run_without_launch_still_computes_float32_in_float32():
    """No legacy XLA_USE_BF16 reaches torch_xla, also when Fabric skips launch() on one device."""
    from conftest import run_python

    result = run_python(
        """
        import torch, lightning as L
        fabric = L.Fabric(accelerator="xla", devices=1, precision="bf16-true")
        fabric.setup(torch.nn.Linear(2, 2))
        x = torch.tensor([1 + 2**-10], device=fabric.device)
        print("difference:", (x - 1).item(), x.dtype)
        """
    )
    assert "difference: 0.0009765625 torch.float32" in result.stdout
    assert "XLA_USE_BF16 will be deprecated" not in result.stdout + result.stderr


def test_a_fabric_run_sets_no_precision_variable():
    fabric = L.Fabric(accelerator="xla", devices=1, precision="bf16-true")
    model = fabric.setup(nn.Linear(2, 2))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not {name for name in ("XLA_USE_BF16", "XLA_USE_F16") if name in os.environ}
