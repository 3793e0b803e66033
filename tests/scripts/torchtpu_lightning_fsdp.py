"""One Lightning script trained fully sharded (torch's FSDP2) in two processes through Lightning's own launcher.

Usage: ``python torchtpu_lightning_fsdp.py API ACCELERATOR MODULE OUTPUT``, API ``trainer`` (a LightningModule
under ``Trainer.fit``) or ``fabric`` (the same steps in a Fabric loop). ``accelerator="tpu"`` (the stand-in:
TORCHTPU_PLUGINS_DEVICE=cpu, TORCHTPU_PLUGINS_DEVICE_COUNT=2) runs ``strategy="fsdp"``; ``accelerator="cpu"`` is
the reference: Lightning's own ``ModelParallelStrategy`` on gloo with a data-parallel mesh of both processes.
MODULE (Trainer) ``self-sharding`` (the reference's, and on "tpu" too) shards each child layer with
``fully_shard`` in ``configure_model``, as Lightning's ModelParallelStrategy asks; ``plain`` leaves the sharding
to the strategy. Fabric shards the same layers: on "cpu" its ``parallelize_fn``, on "tpu" the strategy.
MASTER_ADDR/MASTER_PORT and GLOO_SOCKET_IFNAME=lo keep every address on the loopback. Rank 0 saves
``{"losses", "state" (full CPU tensors), "strategy", "backend", "devices", "sharded", "world_size"}`` to OUTPUT.
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallelStrategy
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset


def _shard(module: nn.Module, device_mesh: object) -> nn.Module:
    for child in module.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=device_mesh["data_parallel"])  # type: ignore[index]
    return module


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 1)
        self.losses: list[float] = []
        self.devices_seen: set[str] = set()
        self.output = ""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.out(torch.tanh(self.hidden(x))), y)
        self.losses.append(loss.item())
        return loss

    def on_train_batch_end(self, *args: object) -> None:
        self.devices_seen |= {p.device.type for p in self.parameters()}

    def on_train_end(self) -> None:
        _save(self.output, self, self.trainer.strategy, self.devices_seen, self.trainer.world_size, self.global_rank)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


class SelfSharding(Regression):
    """The reference's module: shards itself, as Lightning's ModelParallelStrategy asks."""

    def configure_model(self) -> None:
        _shard(self, self.device_mesh)


def _full(value: torch.Tensor, world_size: int) -> torch.Tensor:
    """The whole CPU tensor of a parameter FSDP2 shards on dim 0 (every rank calls this: a collective).

    Gathered as objects (the process group's own collectives): on the stand-in, DTensor's ``full_tensor()``
    runs torch's functional collectives, which find no C++ backend in a "tpu_dist" group written in Python.
    """
    if not isinstance(value, DTensor):
        return value.detach().cpu()
    pieces: list = [None] * world_size
    torch.distributed.all_gather_object(pieces, value.to_local().detach().cpu())
    return torch.cat(pieces, dim=0)


def _save(output: str, model: nn.Module, strategy: object, devices: set[str], world_size: int, rank: int) -> None:
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    state = {name: _full(value, world_size) for name, value in model.state_dict().items()}
    if rank == 0:
        run = {
            "losses": model.losses,  # type: ignore[attr-defined]
            "state": state,
            "strategy": type(strategy).__name__,
            "backend": strategy._process_group_backend,  # type: ignore[attr-defined]
            "devices": devices,
            "sharded": sharded,
            "world_size": world_size,
        }
        torch.save(run, output)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)  # 4 steps per rank


def fabric_main(accelerator: str, module_kind: str, output: str) -> None:
    # Fabric on "tpu": strategy="fsdp" by name shards each child layer as _shard does (MODULE is not read)
    strategy = (
        "fsdp"
        if accelerator == "tpu"
        else FabricModelParallelStrategy(_shard, data_parallel_size=2, tensor_parallel_size=1)
    )
    fabric = L.Fabric(accelerator=accelerator, devices=2, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0, verbose=False)
    model = Regression()
    module = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.Adam(module.parameters(), lr=0.05))
    devices: set[str] = set()
    for x, y in fabric.setup_dataloaders(_loader()):
        loss = nn.functional.mse_loss(model.out(torch.tanh(model.hidden(x))), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        model.losses.append(loss.item())
        devices |= {p.device.type for p in model.parameters()}
    _save(output, model, fabric.strategy, devices, fabric.world_size, fabric.global_rank)


def main(accelerator: str, module_kind: str, output: str) -> None:
    L.seed_everything(0, verbose=False)
    model = Regression() if module_kind == "plain" else SelfSharding()
    model.output = output
    strategy = "fsdp" if accelerator == "tpu" else ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=2,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, _loader())


if __name__ == "__main__":
    (main if sys.argv[1] == "trainer" else fabric_main)(sys.argv[2], sys.argv[3], sys.argv[4])
