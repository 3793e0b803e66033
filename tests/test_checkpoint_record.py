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
    assert decisions["precision"]["choice"] == "xla (xla_plugins.roles.precision.XLAPrecision)"


class CountsCallbackHooks(L.Callback):
    """Records how many callbacks Lightning calls on each training step's hooks (the list it iterates)."""

    def __init__(self) -> None:
        self.callbacks_per_step: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.callbacks_per_step.append(len(trainer.callbacks))


def test_the_record_costs_no_callback_hook_per_step(tmp_path):
    """The checkpoint connector stores the record: Lightning calls no callback of ours on a step's six hooks."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from trainer_plugins import PluginSetCheckpoint, PluginSetCheckpointConnector

    counter = CountsCallbackHooks()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[counter],
    )
    # Lightning's own: the user's callback and the default ModelCheckpoint, nothing of ours
    assert [type(callback) for callback in trainer.callbacks] == [CountsCallbackHooks, ModelCheckpoint]
    assert not any(isinstance(callback, PluginSetCheckpoint) for callback in trainer.callbacks)
    assert type(trainer._checkpoint_connector) is PluginSetCheckpointConnector
    trainer.fit(BoringModel())
    assert counter.callbacks_per_step == [2, 2]
    (path,) = (tmp_path / "checkpoints").glob("*.ckpt")
    assert torch.load(path, weights_only=False)[CHECKPOINT_KEY]["plugins"]
    # a weights-only checkpoint has no record, as it has no callback states
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    assert CHECKPOINT_KEY not in torch.load(tmp_path / "weights.ckpt", weights_only=False)


def test_a_user_added_plugin_set_callback_writes_the_same_record_before_the_modules_hook(tmp_path):
    from trainer_plugins import PluginSetCheckpoint

    class SeesTheRecord(BoringModel):
        def on_save_checkpoint(self, checkpoint):
            self.seen = checkpoint.get(CHECKPOINT_KEY)

    module = SeesTheRecord()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PluginSetCheckpoint()],
    )
    trainer.fit(module)
    (path,) = (tmp_path / "checkpoints").glob("*.ckpt")
    assert module.seen is not None and module.seen == torch.load(path, weights_only=False)[CHECKPOINT_KEY]
