"""One unchanged Lightning script, started by any launcher: each process records where it ran and what it trained.

Usage: ``python launch_matrix.py API ACCELERATOR DEVICES NUM_NODES OUTPUT_DIR`` (or the same
under ``torchrun``, srun-like variables, a TPU VM's or SkyPilot's variables). API ``trainer`` (a
LightningModule under ``Trainer.fit``) or ``fabric`` (the same steps in a Fabric loop), with
``accelerator=ACCELERATOR``, ``devices=DEVICES`` (``auto`` or a count), Lightning's ``strategy="ddp"``
(on ``"tpu"`` torchtpu-plugins' DDP) and ``num_nodes=NUM_NODES`` as a user writes them: the script text is
the same on ``"cpu"`` and ``"tpu"``, and the launcher decides how many processes there are and
which rank each has. (Lightning's CPU accelerator takes ``devices="auto"`` as 1 process per host under
any launcher, so a CPU reference run names its count.)

Every process writes ``OUTPUT_DIR/rank-<global rank>.pt``: the cluster environment's class, whether
it says the processes were created outside Lightning, world size, global, local and node rank, the
sample indices of its batches (its sampler's shard), its per-step losses, the final parameters (CPU
copies), the device types of the parameters during the fit, the process-group backend, and this
process's and its parent's ids. Under Ray Train the driver (torchtpu_ray_train.py) calls :func:`main` in
each worker with ``plugins=[RayLightningEnvironment()]``, as Ray's guide has the script name it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, BATCH_SIZE = 64, 8


def _dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=generator)
    return TensorDataset(torch.arange(SAMPLES), x, x.sum(dim=1, keepdim=True))


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []
        self.indices: list[int] = []
        self.devices_seen: set[str] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def note(self, index: torch.Tensor, loss: torch.Tensor) -> None:
        self.losses.append(loss.item())
        self.indices += index.tolist()
        self.devices_seen |= {p.device.type for p in self.parameters()}

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        index, x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.note(index, loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _record(output_dir: str, model: Regression, strategy: object, global_rank: int, world_size: int) -> None:
    environment = strategy.cluster_environment  # type: ignore[attr-defined]
    record = {
        "environment": type(environment).__name__,
        "externally": environment.creates_processes_externally,
        "strategy": type(strategy).__name__,
        "backend": torch.distributed.get_backend(),
        "world_size": world_size,
        "global_rank": global_rank,
        "local_rank": environment.local_rank(),
        "node_rank": environment.node_rank(),
        "indices": model.indices,
        "losses": model.losses,
        "state": {name: value.detach().cpu() for name, value in model.state_dict().items()},
        "devices": model.devices_seen,
        "pid": os.getpid(),
        "ppid": os.getppid(),
    }
    torch.save(record, os.path.join(output_dir, f"rank-{global_rank}.pt"))


def trainer_main(accelerator: str, devices: str, num_nodes: int, output_dir: str, plugins: list) -> None:
    L.seed_everything(0, verbose=False)
    model = Regression()
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=devices,
        strategy="ddp",
        num_nodes=num_nodes,
        plugins=plugins,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(_dataset(), batch_size=BATCH_SIZE))
    _record(output_dir, model, trainer.strategy, trainer.global_rank, trainer.world_size)


def fabric_main(accelerator: str, devices: str, num_nodes: int, output_dir: str, plugins: list) -> None:
    fabric = L.Fabric(accelerator=accelerator, devices=devices, strategy="ddp", num_nodes=num_nodes, plugins=plugins)
    fabric.launch()
    fabric.seed_everything(0, verbose=False)
    model = Regression()
    optimizer = model.configure_optimizers()
    module, optimizer = fabric.setup(model, optimizer)
    for index, x, y in fabric.setup_dataloaders(DataLoader(_dataset(), batch_size=BATCH_SIZE)):
        loss = nn.functional.mse_loss(module(x), y)
        model.note(index, loss)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    _record(output_dir, model, fabric.strategy, fabric.global_rank, fabric.world_size)


def main(args: list[str], plugins: Sequence[object] = ()) -> None:
    """Run the script with its command-line arguments ``args``; ``plugins``: the launcher's (Ray Train's)."""
    api, accelerator, devices, num_nodes, output_dir = args
    run = trainer_main if api == "trainer" else fabric_main
    run(accelerator, devices if devices == "auto" else int(devices), int(num_nodes), output_dir, list(plugins))


if __name__ == "__main__":
    main(sys.argv[1:])
