"""One Lightning script trained with two-process DDP through Lightning's own launcher (a rerun of this script).

Usage: ``python torchtpu_lightning_ddp.py API ACCELERATOR STRATEGY OUTPUT``, API ``trainer`` (a LightningModule
under ``Trainer.fit``) or ``fabric`` (the same steps in a Fabric loop), with ``accelerator="tpu"`` (the stand-in:
TORCHTPU_PLUGINS_DEVICE=cpu and TORCHTPU_PLUGINS_DEVICE_COUNT=2 in the environment) or ``"cpu"`` (gloo), and
``strategy=STRATEGY`` (``"ddp"``, ``"ddp_spawn"``, ``"auto"``: Lightning's names, unchanged between the two
accelerators); MASTER_ADDR/MASTER_PORT and GLOO_SOCKET_IFNAME=lo keep every address on the loopback. Rank 0
saves ``{"losses", "state" (CPU tensors), "strategy", "backend", "devices", "world_size", "start_method"}`` to
OUTPUT, from the process that trained (a spawned one too): the per-step losses of rank 0's batches, and the
device types of the parameters and the optimizer state seen during the fit. The Trainer's ModelCheckpoint
writes ``last.ckpt`` during the fit into OUTPUT's name without extension plus ``-ckpt``.
"""

from __future__ import annotations

import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []
        self.devices_seen: set[str] = set()
        self.output = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    def on_train_end(self) -> None:
        if self.trainer.global_rank == 0:
            _save(self.output, self, self.trainer.strategy, self.devices_seen, self.trainer.world_size)

    def on_train_batch_end(self, *args: object) -> None:
        self.devices_seen |= {p.device.type for p in self.parameters()}
        for state in self.trainer.optimizers[0].state.values():
            self.devices_seen |= {v.device.type for v in state.values() if torch.is_tensor(v) and v.ndim > 0}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


def _save(output: str, model: Regression, strategy: object, devices: set[str], world_size: int) -> None:
    state = {name: value.detach().cpu() for name, value in model.state_dict().items()}
    run = {
        "losses": model.losses,
        "state": state,
        "strategy": type(strategy).__name__,
        "backend": strategy._process_group_backend,  # type: ignore[attr-defined]
        "devices": devices,
        "world_size": world_size,
        "start_method": getattr(strategy, "_start_method", None),
    }
    torch.save(run, output)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)  # 4 steps per rank


def fabric_fit(fabric: L.Fabric) -> tuple[Regression, nn.Module, set[str]]:
    """One epoch of the Fabric loop on a launched ``fabric``: (the model, with this rank's losses; the module
    ``fabric.setup`` returned; the device types of the parameters and optimizer state seen)."""
    fabric.seed_everything(0, verbose=False)
    model = Regression()
    optimizer = model.configure_optimizers()
    module, optimizer = fabric.setup(model, optimizer)  # the optimizer made first, as Lightning's docs show
    devices: set[str] = set()
    for x, y in fabric.setup_dataloaders(_loader()):
        loss = nn.functional.mse_loss(module(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        model.losses.append(loss.item())
        devices |= {p.device.type for p in module.parameters()}
        for state in optimizer.state.values():
            devices |= {v.device.type for v in state.values() if torch.is_tensor(v) and v.ndim > 0}
    return model, module, devices


def fabric_main(accelerator: str, strategy: str, output: str) -> None:
    fabric = L.Fabric(accelerator=accelerator, devices=2, strategy=strategy)
    fabric.launch()
    model, _, devices = fabric_fit(fabric)
    if fabric.global_rank == 0:
        _save(output, model, fabric.strategy, devices, fabric.world_size)


def main(accelerator: str, strategy: str, output: str) -> None:
    L.seed_everything(0, verbose=False)
    loader = _loader()
    model = Regression()
    model.output = output
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=2,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        callbacks=[ModelCheckpoint(dirpath=f"{os.path.splitext(output)[0]}-ckpt", save_top_k=0, save_last=True)],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)


if __name__ == "__main__":
    (main if sys.argv[1] == "trainer" else fabric_main)(sys.argv[2], sys.argv[3], sys.argv[4])
