"""A multi-device run on N PJRT CPU devices, for tests/test_multidevice.py.

Fits a classifier for two epochs with the given XLA strategy and a checkpoint callback, loads the
checkpoint into a CPU-only Trainer, resumes on XLA for a third epoch, and records what every rank
(spawn strategy) or every device (SPMD strategy) saw in ``<out>/rank<r>.jsonl`` plus a summary in
``<out>/summary.json``. Run as a script (``if __name__ == "__main__"``), as XLA launching needs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch
import torch_xla
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EPOCHS = 2
BATCH = 8
#: Under SPMD one process sees global tensors; what each device holds is read from its shard.
SPMD = False


def per_device(tensor: torch.Tensor) -> dict[int, list]:
    """What each device holds of ``tensor``: its shard under SPMD (key = device), else all of it (key -1)."""
    if not (SPMD and tensor.device.type == "xla"):
        return {-1: tensor.tolist()}
    torch_xla.sync(wait=True)  # shards can be read only once no execution is in flight
    shards = torch_xla._XLAC._get_local_shards([tensor])[0]
    return {int(device.split(":")[1]): shard.tolist() for shard, device in shards}


class Recorder(L.LightningModule):
    """Writes what its rank (or, under SPMD, each device) sees to ``<out>/rank<r>.jsonl``."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

    def record(self, devices: dict[int, object] | None = None, **row: object) -> None:
        for device, value in (devices or {-1: None}).items():
            rank = self.global_rank if device == -1 else device
            with open(os.path.join(self.out, f"rank{rank}.jsonl"), "a") as file:
                file.write(json.dumps({**row, "value": value}) + "\n")

    def on_train_start(self) -> None:
        loader = self.trainer.train_dataloader
        sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
        val_loaders = self.trainer.val_dataloaders
        val_sampler = getattr(getattr(val_loaders, "batch_sampler", None), "sampler", None)
        self.record(
            kind="loaders",
            loader=type(loader).__name__,
            exposes=[hasattr(loader, "dataset"), hasattr(loader, "batch_sampler")],
            sampler=type(sampler).__name__,
            shuffle=getattr(sampler, "shuffle", None),
            replicas=[getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None)],
            user_marker=getattr(sampler, "user_marker", False),
            val_shuffle=getattr(val_sampler, "shuffle", None),
            world_size=self.trainer.world_size,
        )
        strategy = self.trainer.strategy
        strategy.barrier("recorder")
        strategy.barrier(None)
        mine = torch.tensor([float(self.global_rank)], device=self.device)
        self.record(
            kind="collectives",
            gathered=self.all_gather(mine).flatten().tolist(),
            broadcast=strategy.broadcast(self.global_rank * 10 + 7, src=0),
            reduced=strategy.reduce(torch.tensor(self.global_rank + 1.0, device=self.device), reduce_op="sum").item(),
        )

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.record(
            kind="step", epoch=self.current_epoch, step=self.global_step, loss=loss.item(), devices=per_device(index)
        )
        return loss

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y), sync_dist=True)

    def on_train_end(self) -> None:
        if SPMD and self.device.type == "xla":
            torch_xla.sync(wait=True)
            copies = torch_xla._XLAC._get_local_shards(list(self.parameters()))
            for device in range(len(copies[0])):
                self.record(
                    kind="parameters", devices={device: [param[device][0].flatten().tolist() for param in copies]}
                )
        else:
            self.record(
                kind="parameters", devices={-1: [p.detach().cpu().flatten().tolist() for p in self.parameters()]}
            )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def make_trainer(args: argparse.Namespace, epochs: int, root: str, **flags: object) -> L.Trainer:
    flags = {"accelerator": "xla", "devices": args.devices, "strategy": args.strategy, **flags}
    return L.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **flags,
    )


def main() -> None:
    global SPMD
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=("xla", "xla_spmd"), required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    SPMD = args.strategy == "xla_spmd"
    if not SPMD:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import xla_cpu_harness

        xla_cpu_harness.install()

    size = 64 if SPMD else 62  # 62 samples on 4 replicas: the distributed sampler pads 2
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(size, 8, generator=generator)
    dataset = TensorDataset(features, (features[:, 0] + features[:, 1] > 0).long(), torch.arange(size))
    train, val = DataLoader(dataset, batch_size=BATCH, shuffle=True), DataLoader(dataset, batch_size=BATCH)

    os.makedirs(args.out, exist_ok=True)
    checkpoints = os.path.join(args.out, "checkpoints")
    fit = make_trainer(args, EPOCHS, args.out, callbacks=[ModelCheckpoint(dirpath=checkpoints)])
    model = Recorder(args.out)
    fit.fit(model, train, val)
    main_parameters = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    files = sorted(os.listdir(checkpoints))
    path = os.path.join(checkpoints, files[0])
    state = torch.load(path, weights_only=False)  # no map_location: XLA tensors would not load here

    resumed_out = os.path.join(args.out, "resumed")
    os.makedirs(resumed_out)
    user_sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    user_sampler.user_marker = True  # a user's own sampler must be used as given
    resumed = make_trainer(args, EPOCHS + 1, resumed_out, enable_checkpointing=False)
    resumed.fit(Recorder(resumed_out), DataLoader(dataset, batch_size=BATCH, sampler=user_sampler), ckpt_path=path)

    # Last: a backward pass in this process would be inherited, half set up, by later forked workers.
    cpu_out = os.path.join(args.out, "cpu")
    os.makedirs(cpu_out)
    cpu = make_trainer(
        args, EPOCHS + 1, cpu_out, accelerator="cpu", devices=1, strategy="auto", enable_checkpointing=False
    )
    cpu.fit(Recorder(cpu_out), train, ckpt_path=path)

    summary = {
        "strategy": f"{type(fit.strategy).__module__}.{type(fit.strategy).__name__}",
        "is_distributed": fit._accelerator_connector.is_distributed,
        "checkpoints": files,
        "checkpoint_devices": sorted({tensor.device.type for tensor in state["state_dict"].values()}),
        "checkpoint_global_step": state["global_step"],
        "size": size,
        "main_parameters": main_parameters,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as file:
        json.dump(summary, file)


if __name__ == "__main__":
    main()
