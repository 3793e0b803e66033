"""Without torch_xla (the core-only environment): the core works, selecting XLA fails clearly."""

from __future__ import annotations

import pytest
from conftest import HAS_TORCH_XLA

pytestmark = pytest.mark.skipif(HAS_TORCH_XLA, reason="checks the behaviour when torch_xla is not installed")


@pytest.mark.parametrize("name", ["tpu", "xla"])
def test_selecting_xla_raises_module_not_found_naming_torch_xla(name):
    import lightning as L

    with pytest.raises(
        ModuleNotFoundError, match=r"needs torch_xla>=2\.8, which is not installed\. pip install"
    ) as info:
        L.Trainer(accelerator=name, devices=1)
    assert info.value.name == "torch_xla"


def test_training_on_cpu_goes_through_the_plugin_connector_unchanged():
    import lightning as L
    import torch
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.strategies import SingleDeviceStrategy

    import trainer_plugins

    trainer = L.Trainer(
        accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(BoringModel())
    assert trainer_plugins.installed()
    assert type(trainer._accelerator_connector).__name__ == "TrainerConnector"
    assert type(trainer.strategy) is SingleDeviceStrategy and trainer.strategy.root_device == torch.device("cpu")
    assert trainer.global_step == 2


@pytest.mark.parametrize(
    "legacy", ["TPUAccelerator", "SingleTPUStrategy", "TPUPrecisionPlugin", "TPUBf16PrecisionPlugin"]
)
def test_legacy_classes_warn_then_name_torch_xla_and_leave_no_variable(legacy):
    import os

    import xla_plugins

    with pytest.deprecated_call(match=f"`{legacy}`"):
        with pytest.raises(ModuleNotFoundError, match="torch_xla"):
            getattr(xla_plugins, legacy)()
    assert not {name for name in ("XLA_USE_F16", "XLA_USE_BF16") if name in os.environ}


def test_the_legacy_strategy_name_warns_then_names_torch_xla():
    import lightning as L

    with pytest.deprecated_call(match="The strategy name 'single_tpu' is deprecated"):
        with pytest.raises(ModuleNotFoundError, match="torch_xla"):
            L.Trainer(accelerator="tpu", devices=1, strategy="single_tpu")
