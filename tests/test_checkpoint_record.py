"""Every checkpoint records which plugin, at which version, supplied each role."""

from __future__ import annotations

from importlib.metadata import version

import pytest

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

from trainer_plugins import CHECKPOINT_KEY  # noqa: E402


def fit_and_load(tmp_path, **flags) -> dict:
    trainer = L.Trainer(
        max_steps=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **flags,
    )
    trainer.fit(BoringModel())
    (path,) = (tmp_path / "checkpoints").glob("*.ckpt")
    return torch.load(path, weights_only=False)[CHECKPOINT_KEY]


def test_a_cpu_checkpoint_records_lightnings_roles_and_the_plugin_set(tmp_path):
    record = fit_and_load(tmp_path, accelerator="cpu")
    decisions = {row["role"]: row for row in record["decisions"]}
    assert (
        decisions["strategy"]["choice"]
        == "single_device (lightning.pytorch.strategies.single_device.SingleDeviceStrategy)"
    )
    assert decisions["accelerator"]["plugin"] == f"lightning (lightning {version('lightning')})"
    plugins = {row["name"]: row for row in record["plugins"]}
    assert plugins["lightning"] == {
        "name": "lightning",
        "distribution": "lightning",
        "version": version("lightning"),
        "state": "loaded",
    }
    assert plugins["xla"]["distribution"] == "xla-plugins"


@pytest.mark.xla
def test_an_xla_checkpoint_records_the_xla_plugin_and_its_version(tmp_path):
    record = fit_and_load(tmp_path, accelerator="xla", devices=1, precision="bf16-true")
    decisions = {row["role"]: row for row in record["decisions"]}
    label = f"xla (xla-plugins {version('xla-plugins')})"
    assert {decisions[role]["plugin"] for role in ("accelerator", "strategy", "precision", "environment")} == {label}
    assert decisions["precision"]["choice"] == "xla (xla_plugins.precision.XLAPrecision)"
