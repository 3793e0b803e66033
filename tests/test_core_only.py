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
