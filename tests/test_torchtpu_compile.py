"""torch.compile(backend="tpu") where Lightning compiles, on the stand-in device (in-process; not verified on TPU).

The stand-in's "tpu" backend (torchtpu_plugins.standin._compile, found by dynamo through the
torch_dynamo_backends entry point) hands the graph to torch's aot_eager: a compiled fit computes what the eager
one does, here bit for bit (CPU kernels both ways).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.torchtpu


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def _compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _trainer_losses(compiled: bool) -> list[float]:
    L.seed_everything(0, verbose=False)
    module = Regression()
    model = torch.compile(module, backend="tpu") if compiled else module
    trainer = L.Trainer(
        accelerator="tpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, _loader())
    assert trainer.strategy.root_device == torch.device("tpu", 0)
    return module.losses


def test_the_tpu_backend_is_the_standins_through_dynamos_entry_point():
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    from torchtpu_plugins.standin import _compile

    assert "tpu" in list_backends()
    assert lookup_backend("tpu") is _compile.backend


def test_a_compiled_lightningmodule_fits_on_tpu_as_the_eager_one():
    torch._dynamo.reset()
    before = _compiled_graphs()
    compiled = _trainer_losses(compiled=True)
    assert _compiled_graphs() > before  # dynamo captured graphs and handed them to backend "tpu"
    eager = _trainer_losses(compiled=False)
    assert len(compiled) == 8
    assert compiled == eager


def _fabric_losses(compiled: bool) -> tuple[list[float], object]:
    fabric = L.Fabric(accelerator="tpu", devices=1)
    fabric.seed_everything(0, verbose=False)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    if compiled:
        model = torch.compile(model, backend="tpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    module, optimizer = fabric.setup(model, optimizer, _reapply_compile=True)
    losses = []
    for _ in range(2):
        for x, y in fabric.setup_dataloaders(_loader()):
            loss = nn.functional.mse_loss(module(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses, module


def test_fabric_reapplies_the_tpu_compile_on_the_device_and_trains_as_eager():
    torch._dynamo.reset()
    before = _compiled_graphs()
    compiled, module = _fabric_losses(compiled=True)
    assert isinstance(module._forward_module, torch._dynamo.eval_frame.OptimizedModule)
    assert module._forward_module._orig_mod[0].weight.device == torch.device("tpu", 0)
    assert _compiled_graphs() > before
    eager, _ = _fabric_losses(compiled=False)
    assert compiled == eager


def test_the_tpu_backend_refuses_options_and_runs_only_on_the_standin_mocked_off(monkeypatch):
    from torchtpu_plugins import standin
    from torchtpu_plugins.standin import _compile

    with pytest.raises(ValueError, match=r"backend 'tpu' takes no options, got \['max_autotune'\]"):
        _compile.backend(None, [], max_autotune=True)
    monkeypatch.setattr(standin, "installed", lambda: False)  # as in a process without the stand-in
    with pytest.raises(RuntimeError, match=r"runs on its stand-in device only.*TorchTPU's own 'tpu' backend"):
        _compile.backend(None, [])
